"""End to end: the run registry, runs/status/logs/cancel by name, through the real local cluster."""

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import rank_pids, run_cli, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

HELD = "name: held\nresources: {nodes: 1, time: '00:02:00'}\ntrain: {max_steps: 1}\n"


def test_fifty_submits_at_once_are_all_recorded_and_listed(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "held.yaml").write_text(HELD)

    def submit(_):
        return subprocess.run([sys.executable, "-m", "hpcsuite", "submit", "held.yaml", "--hold"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(50) as pool:
        done = list(pool.map(submit, range(50)))
    ids = [p.stdout.strip() for p in done]
    try:
        assert all(p.returncode == 0 for p in done), [p.stderr for p in done if p.returncode]
        assert len(set(ids)) == 50
        lines = (tmp_path / ".hpcsuite" / "runs.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert sorted(r["job_id"] for r in records) == sorted(ids)
        for r in records:
            assert r["spec"] == str(tmp_path / "held.yaml") and r["name"] == "held"
            assert (tmp_path / r["run_dir"] / "job.sbatch").is_file()
            assert json.loads((tmp_path / r["run_dir"] / "profile.json").read_text())["mpi"]
        listed = json.loads(run_cli("runs", "--json", "-n", "0", cwd=tmp_path, env=env,
                                    check=True).stdout)
        assert [r["job_id"] for r in listed] == [r["job_id"] for r in records]
        assert {r["state"] for r in listed} == {"PENDING"}
        # A name means its latest run; cancel by name.
        latest = records[-1]["job_id"]
        status = json.loads(run_cli("status", "held", "--json", cwd=tmp_path, env=env,
                                    check=True).stdout)
        assert status["job_id"] == latest and status["reason"] == "JobHeldUser"
        out = run_cli("cancel", "held", cwd=tmp_path, env=env, check=True)
        assert out.stdout.strip() == f"cancelled {latest} (it was PENDING)"
    finally:
        subprocess.run(["scancel", *[i for i in ids if i.isdigit()]], env=env, timeout=60)


def test_follow_a_job_by_name_then_its_status_and_rank_logs(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "follow.yaml").write_text(
        "name: follow\nresources: {nodes: 2, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 1000, max_steps: 1500}\n")
    job_id = run_cli("submit", "follow.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    followed = run_cli("logs", "follow", "-f", cwd=tmp_path, env=env, timeout=600)
    assert followed.returncode == 0, followed.stderr
    assert "hpcsuite train: completed at step 1500" in followed.stdout
    status = json.loads(run_cli("status", "follow", "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    assert status["job_id"] == job_id and status["state"] == "COMPLETED"
    assert status["progress"]["step"] > 0 and status["progress"]["samples_per_s"] > 0
    assert status["results"]["final_step"] == 1500
    text = run_cli("status", "follow", cwd=tmp_path, env=env, check=True).stdout
    assert text.startswith(f"job {job_id} (follow): COMPLETED") and "results: completed" in text
    rank1 = run_cli("logs", "follow", "--rank", "1", cwd=tmp_path, env=env, check=True).stdout
    assert "rank 1 " in rank1 and "rank 0 " not in rank1
    listed = run_cli("runs", cwd=tmp_path, env=env, check=True).stdout
    assert job_id in listed and "COMPLETED" in listed
    unknown = run_cli("status", "nosuchrun", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and "runs.jsonl" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_submit_wait_shows_progress_and_exits_with_the_outcome(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "w.yaml").write_text(
        "name: w\nresources: {nodes: 1, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 1000, max_steps: 3000}\n")
    proc = run_cli("submit", "w.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    states = [line for line in proc.stderr.splitlines() if "] job " in line]
    assert any(": RUNNING" in line for line in states), proc.stderr
    assert "completed at step 3000" in proc.stdout


def test_accounting_reaches_status_and_runs_with_the_clusters_own_profile(local_cluster, tmp_path):
    """With the shell set up as `eval "$(hpcsuite cluster env)"` does: jobs render with the
    cluster's own site profile, run as root through its TaskProlog (no template line), and
    status/runs read exit codes, elapsed time and MaxRSS from sacct (slurmdbd + MariaDB)."""
    cluster, env = local_cluster
    exports = run_cli("cluster", "env", env=env, check=True).stdout.splitlines()
    assert exports == [f"export SLURM_CONF={cluster.conf}",
                       f"export HPCSUITE_PROFILE={cluster.profile}"]
    env = {**env, **cluster.client_env()}
    (tmp_path / "ok.yaml").write_text(
        "name: acct-ok\nresources: {nodes: 2, time: '00:05:00', partition: debug}\n"
        "train: {data: {samples: 2048, shape: [32]}, batch_size: 32, max_steps: 40}\n")
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "bad.yaml").write_text(
        "name: acct-bad\nresources: {nodes: 1, time: '00:05:00'}\ntrain: {script: fail.py}\n")
    ok = run_cli("submit", "ok.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run_cli("submit", "bad.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr

    # slurmdbd stores a finished job's steps (their MaxRSS) shortly after Slurm reports it done.
    deadline = time.monotonic() + 60
    while True:
        status = json.loads(run_cli("status", "acct-ok", "--json", cwd=tmp_path, env=env,
                                    check=True).stdout)
        if status["max_rss"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status["state"] == "COMPLETED" and status["exit_code"] == "0:0"
    assert status["source"] == "scontrol+sacct", status
    assert (status["max_rss"] or "-")[-1] in "KMG", status   # a 5 s job is sampled too
    # The progress record ends at the final step, not at a sample from up to 2 s before it.
    # max_steps alone trains max_steps: 40, past the first epoch's 32 steps
    assert status["progress"]["step"] == status["results"]["final_step"] == 40
    run_dir = tmp_path / status["run_dir"]
    assert json.loads((run_dir / "profile.json").read_text())["name"] == "local"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in (run_dir / "job.sbatch").read_text()
    text = run_cli("status", "acct-ok", cwd=tmp_path, env=env, check=True).stdout
    assert "exit 0:0" in text and "MaxRSS" in text and "from scontrol+sacct" in text

    listed = {r["name"]: r for r in json.loads(run_cli("runs", "--json", cwd=tmp_path, env=env,
                                                       check=True).stdout)}
    assert listed["acct-ok"]["source"] == "sacct" and listed["acct-ok"]["max_rss"]
    assert listed["acct-bad"]["state"] == "FAILED" and listed["acct-bad"]["exit_code"] != "0:0"
    deadline = time.monotonic() + 60       # slurmdbd may store the last job a moment later
    while True:
        sacct = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobName,State"], env=env,
                               capture_output=True, text=True, timeout=60).stdout
        if ("acct-ok|COMPLETED" in sacct and "acct-bad|FAILED" in sacct) or \
                time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "acct-ok|COMPLETED" in sacct and "acct-bad|FAILED" in sacct, sacct


def test_cancel_stops_a_running_job_and_its_ranks(local_cluster, tmp_path):
    import time

    cluster, env = local_cluster
    (tmp_path / "long.yaml").write_text(
        "name: long\nresources: {nodes: 2, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 100000}\n")
    job_id = run_cli("submit", "long.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    wait_for_text(tmp_path / "runs" / "long" / f"slurm-{job_id}.out", "training:", timeout=300)
    run_dir = tmp_path / "runs" / "long" / job_id
    assert len(rank_pids(run_dir)) == 2
    out = run_cli("cancel", "long", cwd=tmp_path, env=env, check=True)
    assert out.stdout.strip() == f"cancelled {job_id} (it was RUNNING)"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and rank_pids(run_dir):
        time.sleep(0.5)
    assert not rank_pids(run_dir), "a rank outlived scancel"
    while time.monotonic() < deadline:
        status = json.loads(run_cli("status", "long", "--json", cwd=tmp_path, env=env,
                                    check=True).stdout)
        if status["state"] != "COMPLETING":
            break
        time.sleep(1)
    assert status["state"] == "CANCELLED"
