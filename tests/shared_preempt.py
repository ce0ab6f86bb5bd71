"""Session-scoped shared end-to-end jobs: the managed preempted job and the time-limit jobs
(issue 52, point 4). Registered by conftest.py's pytest_plugins.

Each job runs once, the first time a test asks for it, and is read by several tests; a test
only reads what the job left (its records, `status`, `logs`, `runs`), never changes it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import docblocks
from conftest import REPO, SBATCH, follow_job, run_cli

PAGE = REPO / "docs" / "user" / "preemption.md"
# The page's block as it must read for the fixture to run it; job 42 is the id submit printed.
BLOCK = [["hpcsuite", "submit"], ["scancel", "--signal=USR1"], ["hpcsuite", "status"],
         ["hpcsuite", "logs"]]
# Set by a project profile, so the page's lines still run as written: the ranks record every
# sample id they train (test_e2e_train's check that none is trained twice or lost on resume).
LEDGER_PROFILE = "defaults: {train: {ledger: true}}\n"


@dataclass(frozen=True)
class PreemptedJob:
    """The preemption page's job, stopped by the page's `scancel` mid-run, requeued and
    resumed to completion."""
    work: Path                 # the submit directory: sbatch/preemptible.yaml, runs/, .hpcsuite/
    env: dict                  # the environment the page's lines ran in
    job_id: str
    lines: list[list[str]]     # the page's commands, job 42 being this job
    state: dict                # `status --json` once it ended
    held_status: str           # `status` while Slurm held the requeued attempt (BeginTime)

    @property
    def spec(self) -> Path:
        return self.work / "sbatch" / "preemptible.yaml"

    @property
    def run_dir(self) -> Path:
        return self.work / "runs" / "preemptible" / self.job_id

    @property
    def log(self) -> Path:
        return self.work / "runs" / "preemptible" / f"slurm-{self.job_id}.out"


def _wait_for_step(run_dir: Path, step: int, timeout: float = 180) -> None:
    """Until rank 0's progress.json (written every ~2 s) shows ``step``: the ranks are
    training, so the signal lands mid-run."""
    from hpcsuite.runs.rundir import RunDir

    progress = RunDir(run_dir).progress
    deadline = time.monotonic() + timeout
    while not (progress.is_file() and json.loads(progress.read_text()).get("step", 0) >= step):
        assert time.monotonic() < deadline, f"the job never reached step {step}"
        time.sleep(0.3)


@pytest.fixture(scope="session")
def preempted_job(local_cluster, tmp_path_factory) -> PreemptedJob:
    """docs/user/preemption.md's preempt-by-hand block, run as written from a copy of
    sbatch/preemptible.yaml (2 nodes, 5 epochs), with a ledger: submit, the page's `scancel`
    once the ranks train (step 20), then followed to its end.

    Read by test_e2e_docs::test_the_preemption_pages_block_preempts_a_job_by_hand (the page's
    `status` and `logs` lines), test_e2e_train::test_preemption_checkpoints_requeues_and_resumes
    (the resumed run, its ledger) and test_e2e_truth::
    test_attempts_are_numbered_one_way_in_status_logs_and_records (`status` during the hold)."""
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}      # as `eval "$(hpcsuite cluster env)"` sets it
    work = tmp_path_factory.mktemp("preempted")
    (work / "sbatch").mkdir()
    shutil.copy(SBATCH / "preemptible.yaml", work / "sbatch")
    (work / ".hpcsuite").mkdir()
    (work / ".hpcsuite" / "profile.yaml").write_text(LEDGER_PROFILE)
    text = next(b.text for b in docblocks.blocks([PAGE]) if b.lang == "bash")
    lines = docblocks.commands(text)
    assert [argv[:2] for argv in lines] == BLOCK, lines
    submitted = run_cli(*lines[0][1:], cwd=work, env=env, check=True)
    job_id = submitted.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), submitted.stdout
    lines = [[job_id if w == "42" else w for w in argv] for argv in lines]
    try:
        _wait_for_step(work / "runs" / "preemptible" / job_id, 20)
        subprocess.run(lines[1], env=env, check=True)
        seen: list[str] = []       # `status` while Slurm held the requeued attempt

        def on_hold(_state):
            if not seen:
                seen.append(run_cli("status", job_id, cwd=work, env=env, check=True).stdout)

        state = follow_job(env, job_id, work, cluster, timeout=600, on_hold=on_hold)
        held = seen[0] if seen else ""
    except BaseException:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
        raise
    return PreemptedJob(work, env, job_id, lines, state, held)


# ------------------------------------------------------------------ the time limits
# Both on one node, so the two run at once on the two-node cluster: the job that stops itself
# before its limit and the job Slurm ends. slurmctld checks limits every 30 s and sends the
# warning signal at the first check with at most lead + 30 s left (job_mgr.c,
# send_job_warn_signal): 60-90 s into a 2-minute job, when its ranks train. In a 1-minute job it
# would come 0-30 s in, often before the ranks exist; and the check that signals the 2-minute
# job is the one that ends the 1-minute TIMEOUT job, so a 1-minute limit would not end the pair
# sooner.
LIMIT = """name: limit
resources: {nodes: 1, tasks_per_node: 1, time: "00:02:00"}
train:
  data: {samples: 1000000, shape: [64], classes: 4}
  batch_size: 16
  epochs: 100
  checkpoint: {every_steps: 100000}
"""

TIMEOUT_JOB = """name: ckrel
resources: {nodes: 1, time: "00:01:00"}
train:
  data: {samples: 4096, shape: [32]}
  batch_size: 32
  epochs: 100000
  checkpoint: {every_steps: 20, dir: ckpt}
  preemption: {lead_seconds: 0}     # no stop before the limit: Slurm ends it, TIMEOUT
"""


@dataclass(frozen=True)
class Waited:
    """`submit --wait --json` of a job, as it returned."""
    work: Path
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class TimedOut:
    """A job submitted from ``work`` whose time limit Slurm enforced; ``elsewhere``: another
    directory to run `status` from."""
    work: Path
    elsewhere: Path
    job_id: str
    state: dict                # `status --json` once it ended
    seconds: float             # from submit to the end seen


@dataclass(frozen=True)
class TimeLimitJobs:
    limit: Waited              # LIMIT: no preemption keys, the default warning signal
    timeout: TimedOut          # TIMEOUT_JOB: lead_seconds 0, a relative checkpoint.dir


@pytest.fixture(scope="session")
def time_limit_jobs(local_cluster, tmp_path_factory) -> TimeLimitJobs:
    """LIMIT through `submit --wait --json` and TIMEOUT_JOB submitted beside it, both followed
    to their end.

    Read by test_e2e_reliability::test_a_job_reaching_its_time_limit_saves_first_and_says_so
    (``limit``) and test_e2e_review::test_status_from_another_directory_finds_a_relative_
    checkpoint_dir (``timeout``)."""
    _, env = local_cluster
    root = tmp_path_factory.mktemp("time-limits")
    limit_dir, project, elsewhere = root / "limit", root / "project", root / "elsewhere"
    for d in (limit_dir, project, elsewhere):
        d.mkdir()
    (project / "job.yaml").write_text(TIMEOUT_JOB)
    (limit_dir / "limit.yaml").write_text(LIMIT)
    t0 = time.monotonic()
    timeout_id = run_cli("submit", "job.yaml", cwd=project, env=env, check=True).stdout.strip()
    waiting = subprocess.Popen([sys.executable, "-m", "hpcsuite", "submit", "limit.yaml", "--wait",
                                "--json"], cwd=limit_dir, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = waiting.communicate(timeout=600)
        state = follow_job(env, timeout_id, project, timeout=300)
    except BaseException:
        waiting.kill()
        limit_ids = [d.name for d in (limit_dir / "runs" / "limit").glob("*") if d.name.isdigit()]
        subprocess.run(["scancel", timeout_id, *limit_ids], env=env, capture_output=True,
                       timeout=60)
        raise
    return TimeLimitJobs(Waited(limit_dir, waiting.returncode, out, err),
                         TimedOut(project, elsewhere, timeout_id, state, time.monotonic() - t0))
