"""Wrong answers a code review found (issue 42, point 13), end to end on the local cluster:
a write after sbatch that fails keeps the job id, a relative checkpoint directory is found by
`status` from any directory, and an input error's headline is what the failing rank said."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_write_after_sbatch_that_fails_still_prints_the_job_id(local_cluster, tmp_path):
    """Slurm has the job once sbatch answered: a run directory that cannot be made (here its
    name is taken by a file; a full or over-quota disk fails the same way) is a warning, and
    the job id is printed with exit 0, never `error:` and exit 2 while the job exists."""
    cluster, env = local_cluster
    (tmp_path / "held.yaml").write_text(
        "name: held\nresources: {nodes: 1, time: '00:02:00'}\ntrain: {max_steps: 1}\n")
    # The private cluster numbers its jobs one after another: the next id is the probe's + 1.
    probe = subprocess.run(["sbatch", "--parsable", "--hold", "--wrap", "true"], env=env,
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    subprocess.run(["scancel", probe], env=env, check=True, timeout=60)
    job_id = str(int(probe) + 1)
    taken = tmp_path / "runs" / "held" / job_id
    taken.parent.mkdir(parents=True)
    taken.write_text("in the way\n")
    proc = run_cli("submit", "held.yaml", "--hold", cwd=tmp_path, env=env, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == job_id, (proc.stdout, proc.stderr)
        assert f"submitted job {job_id}, but could not move its script into {taken} " \
               "(it stays at " in proc.stderr and "error:" not in proc.stderr, proc.stderr
        staged = proc.stderr.split("(it stays at ")[1].split(")")[0]
        assert Path(staged).read_text().startswith("#!")       # the script that was submitted
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env,
                               capture_output=True, text=True, timeout=60).stdout
        assert "JobState=PENDING" in shown and "Reason=JobHeldUser" in shown, shown
        # the registry, elsewhere, has it: once the way is clear, status by name finds the job
        taken.unlink()
        status = json.loads(run_cli("status", "held", "--json", cwd=tmp_path, env=env,
                                    check=True).stdout)
        assert status["job_id"] == job_id and status["state"] == "PENDING"
    finally:
        subprocess.run(["scancel", job_id], env=env, timeout=60)


def test_status_from_another_directory_finds_a_relative_checkpoint_dir(local_cluster,
                                                                       time_limit_jobs):
    """train.checkpoint.dir: ckpt is the submit directory's; `status` run elsewhere reads the
    same directory the ranks saved in, not ./ckpt of wherever it runs. The job is
    shared_preempt.TIMEOUT_JOB (1 node, 1 minute, no stop before the limit), run beside the
    time-limit job of test_e2e_reliability."""
    cluster, env = local_cluster
    timed_out = time_limit_jobs.timeout
    work, elsewhere, state = timed_out.work, timed_out.elsewhere, timed_out.state
    print(f"TIMEOUT after {timed_out.seconds:.0f}s")
    assert state["state"] == "TIMEOUT", state
    saved = sorted((work / "ckpt").glob("step-*"))
    assert saved, "the job saved no checkpoint in the submit directory's ckpt/"
    job = json.loads((Path(state["run_dir"]) / "job.json").read_text())
    assert job["train"]["checkpoint"]["dir"] == str(work / "ckpt")
    for cwd in (elsewhere, work):
        text = run_cli("status", timed_out.job_id, cwd=cwd, env=env, check=True).stdout
        assert "no checkpoint was saved" not in text, (cwd, text)
        assert "the last checkpoint is step " in text and str(work / "ckpt") in text, text


def test_an_input_errors_headline_is_what_the_failing_rank_said(local_cluster, tmp_path):
    """The site's setup printed an `error: ` line of its own before the ranks started (a module
    system's complaint, say), and srun adds its own: the headline of an input error (exit 2)
    is the FAILED marker's, what the failing rank reported, as it is for any failure."""
    cluster, env = local_cluster
    profile = tmp_path / "site.yaml"
    profile.write_text(cluster.profile.read_text() + "setup:\n"
                       "  - \"echo 'error: module cuda/12.4 is not available here (ignored)'\"\n")
    (tmp_path / "job.yaml").write_text(
        "name: badmodel\nlauncher: srun\nresources: {nodes: 1, time: '00:02:00'}\n"
        "train: {model: nosuchmodel, max_steps: 1}\n")
    proc = run_cli("submit", "job.yaml", "--wait", "--profile", str(profile), cwd=tmp_path,
                   env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    headline = next(l for l in proc.stderr.splitlines() if l.startswith("error: "))
    assert "ended FAILED: unknown model 'nosuchmodel'" in headline, proc.stderr
    assert "module cuda/12.4" not in headline
