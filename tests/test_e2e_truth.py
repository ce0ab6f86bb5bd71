"""End to end on the local Slurm cluster: what `cancel`, `status`, `logs`, `runs` and a sweep's
resubmission say is what happened. cancel of a running, a finished, an unknown and an
already-cancelled job; a failed job's status names its error; logs of a rank the job does not
have, and of a job that waits; an element cancelled before it ran named NEVER RAN everywhere;
a resubmitted element that keeps the sweep's max_parallel."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import run_cli, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_cancel_says_what_it_did_and_status_and_logs_say_what_is(local_cluster, broken_job,
                                                                  tmp_path):
    _, env = local_cluster
    # a job that fails on an error hpcsuite reports in the job (conftest.broken_job, shared with
    # test_e2e's failing job): status shows that error
    _, there, broken = broken_job
    assert broken.returncode == 2, broken.stdout + broken.stderr
    text = run_cli("status", "broken", cwd=there, env=env, check=True).stdout
    assert re.search(r"  error \(attempt 0, rank 0 on \S+\): unknown model 'nosuchmodel'", text), text
    status = json.loads(run_cli("status", "broken", "--json", cwd=there, env=env,
                                check=True).stdout)
    assert status["error"]["message"].startswith("unknown model 'nosuchmodel'")
    broken_id = status["job_id"]

    # a finished job: nothing to cancel, exit 2, one line
    ended = run_cli("cancel", "broken", cwd=there, env=env)
    assert ended.returncode == 2 and ended.stdout == ""
    assert ended.stderr == f"error: job {broken_id} has already ended (FAILED, exit 2:0): " \
                           "nothing to cancel\n"
    # an id Slurm never had
    unknown = run_cli("cancel", "999999", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "error: job 999999 is not known to Slurm: nothing to cancel"), unknown.stderr

    # a job that waits: logs -f says so (on stderr) and follows until it ends
    (tmp_path / "held.yaml").write_text("name: held\nresources: {nodes: 1, time: '00:02:00'}\n"
                                        "train: {max_steps: 1}\n")
    held = run_cli("submit", "held.yaml", "--hold", cwd=tmp_path, env=env, check=True).stdout.strip()
    waited = run_cli("logs", "held", cwd=tmp_path, env=env)
    assert waited.returncode == 2 and waited.stderr.startswith(
        f"error: job {held} is waiting to start (JobHeldUser: held"), waited.stderr
    follow = subprocess.Popen([sys.executable, "-m", "hpcsuite", "logs", "held", "-f"],
                              cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        first = follow.stderr.readline()
        assert first.startswith(f"job {held} is waiting to start (JobHeldUser"), first
        pending = run_cli("cancel", "held", cwd=tmp_path, env=env)
        assert (pending.returncode, pending.stdout) == (0, f"cancelled {held} (it was PENDING)\n")
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 0, err

    # a running two-rank job: cancelled, then cancelled again
    (tmp_path / "long.yaml").write_text(
        "name: long\nresources: {nodes: 2, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 100000}\n")
    job_id = run_cli("submit", "long.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    wait_for_text(tmp_path / "runs" / "long" / f"slurm-{job_id}.out", "training:", timeout=300)
    rank7 = run_cli("logs", "long", "--rank", "7", cwd=tmp_path, env=env)
    assert rank7.returncode == 2
    assert rank7.stderr == f"error: job {job_id} has no rank 7: it runs 2 rank(s), 0 to 1\n"
    assert run_cli("logs", "long", "--rank", "1", cwd=tmp_path, env=env).returncode == 0
    out = run_cli("cancel", "long", cwd=tmp_path, env=env)
    assert (out.returncode, out.stdout) == (0, f"cancelled {job_id} (it was RUNNING)\n")
    deadline = time.monotonic() + 90
    while json.loads(run_cli("status", job_id, "--json", cwd=tmp_path, env=env,
                             check=True).stdout)["state"] != "CANCELLED":
        assert time.monotonic() < deadline, "the cancelled job never ended CANCELLED"
        time.sleep(1)
    again = run_cli("cancel", "long", cwd=tmp_path, env=env)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr == f"error: job {job_id} was already cancelled: nothing to cancel\n"


JOB = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  model: mlp
  data: {kind: synthetic, samples: 4096, shape: [32], classes: 4}
  batch_size: 32
  epochs: 1000
  max_steps: 1200
"""
SWEEP = """name: slots
base: job.yaml
axes:
  train.seed: [1, 2, 3]
max_parallel: 1
"""


def _running(env: dict, name: str = "slots") -> list[str]:
    """The sweep's elements Slurm runs now (by job name)."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-t", "RUNNING", "-o", "%i"],
                         env=env, capture_output=True, text=True, timeout=30).stdout
    return out.split()


def _follow_sweep(env: dict, cwd, sweep_dir, limit: int, name: str) -> tuple[list, list]:
    """Sample Slurm's running elements until every element has ended, asserting never more
    than ``limit`` at once; (every sample, the last rows of sweep status)."""
    seen, deadline = [], time.monotonic() + 600
    while True:
        now = _running(env, name)
        seen.append(now)
        assert len(now) <= limit, f"{now} run at once; max_parallel is {limit}"
        rows = json.loads(run_cli("sweep", "status", str(sweep_dir), "--json", cwd=cwd,
                                  env=env, check=True).stdout)
        if all(r["finished"] for r in rows):
            return seen, rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)


def test_a_resubmitted_element_keeps_max_parallel_and_never_ran_is_named_alike(local_cluster,
                                                                               tmp_path):
    """max_parallel 1 on a cluster with room for two jobs: Slurm's %1 holds the first array,
    and the element resubmitted while element 0 runs and element 1 waits must wait for both
    (without a dependency it would start at once on the free node: two at once)."""
    _, env = local_cluster
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    sweep_dir = tmp_path / "sweeps" / "slots"
    array = run_cli("sweep", "run", "sweep.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    deadline = time.monotonic() + 120
    while f"{array}_0" not in _running(env):
        assert time.monotonic() < deadline, "element 0 never started"
        time.sleep(0.5)
    cancelled = run_cli("cancel", f"{array}_2", cwd=tmp_path, env=env)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"cancelled {array}_2 (it was PENDING)\n")

    # element 2 never ran: status, runs and sweep status (and its footer) all say so
    status = run_cli("status", f"{array}_2", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"job {array}_2 (slots): NEVER RAN (cancelled before it "
                                    "started"), status.stdout
    runs = {r["job_id"]: r for r in json.loads(run_cli("runs", "--json", cwd=tmp_path, env=env,
                                                       check=True).stdout)}
    assert runs[f"{array}_2"]["state"] == "NEVER RAN"
    rows = json.loads(run_cli("sweep", "status", str(sweep_dir), "--json", cwd=tmp_path, env=env,
                              check=True).stdout)
    assert rows[2]["state"] == "NEVER RAN"
    text = run_cli("sweep", "status", str(sweep_dir), cwd=tmp_path, env=env, check=True).stdout
    assert "1 never ran (cancelled before it started)" in text.splitlines()[-1], text
    twice = run_cli("cancel", f"{array}_2", cwd=tmp_path, env=env)
    assert twice.returncode == 2 and "cancelled before it started leaves no record" in twice.stderr

    # resubmitted while element 0 runs and 1 waits: it waits for both
    again = run_cli("sweep", "resubmit", str(sweep_dir), "--element", "2", "--json",
                    cwd=tmp_path, env=env, check=True)
    resubmitted = json.loads(again.stdout)
    seen, rows = _follow_sweep(env, tmp_path, sweep_dir, 1, "slots")
    assert all(r["done"] for r in rows), rows
    assert resubmitted["waits_for"] == [f"{array}_0", f"{array}_1"], resubmitted
    assert [r["job_id"] for r in rows] == [f"{array}_0", f"{array}_1", resubmitted["job_id"]]
    # Slurm's own record: the three ran one after another
    spans = []
    for job in (f"{array}_0", f"{array}_1", resubmitted["job_id"]):
        rec = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True,
                             text=True, timeout=30).stdout
        fields = dict(f.split("=", 1) for f in rec.split() if "=" in f)
        spans.append((fields["StartTime"], fields["EndTime"]))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    assert any(resubmitted["job_id"] in s for s in seen)   # sampled while it ran, alone


@pytest.fixture(scope="module")
def four_slots(wide_cluster):
    """The session's wide cluster: room for four one-core jobs at once (two nodes of two
    cores)."""
    from conftest import cancel_all

    yield dict(os.environ, SLURM_CONF=str(wide_cluster.conf),
               HPCSUITE_CLUSTER_DIR=str(wide_cluster.root))
    cancel_all(wide_cluster)


def test_max_parallel_2_holds_when_an_element_is_resubmitted_while_two_run(four_slots, tmp_path):
    """Room for four; %2 runs elements 0 and 1 while 2 and 3 wait; element 4, cancelled before
    it ran, resubmitted now waits for 0, 1 and 2 (all live but the newest), never a third."""
    env = four_slots
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "sweep.yaml").write_text(SWEEP.replace("name: slots", "name: pairs").replace(
        "[1, 2, 3]", "[1, 2, 3, 4, 5]").replace("max_parallel: 1", "max_parallel: 2"))
    sweep_dir = tmp_path / "sweeps" / "pairs"
    array = run_cli("sweep", "run", "sweep.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    deadline = time.monotonic() + 120
    while {f"{array}_0", f"{array}_1"} - set(_running(env, "pairs")):
        assert time.monotonic() < deadline, "elements 0 and 1 never ran together"
        time.sleep(0.5)
    run_cli("cancel", f"{array}_4", cwd=tmp_path, env=env, check=True)
    again = run_cli("sweep", "resubmit", str(sweep_dir), "--element", "4", "--json",
                    cwd=tmp_path, env=env, check=True)
    resubmitted = json.loads(again.stdout)
    seen, rows = _follow_sweep(env, tmp_path, sweep_dir, 2, "pairs")
    assert all(r["done"] for r in rows), rows
    assert resubmitted["waits_for"] == [f"{array}_{i}" for i in range(3)], resubmitted
    assert any(len(s) == 2 for s in seen)                  # two at once: the room was used
    assert any(resubmitted["job_id"] in s for s in seen)


def test_attempts_are_numbered_one_way_in_status_logs_and_records(preempted_job):
    """A requeued job's second attempt is attempt 1 in the requeue-delay line of `status`, the
    rank's log, the batch log, attempts.jsonl and results.json (SLURM_RESTART_COUNT). The job:
    shared_preempt.preempted_job, whose `status` was taken while Slurm held the requeue."""
    job = preempted_job
    assert job.state["state"] == "COMPLETED", job.log.read_text()[-3000:]
    said = job.held_status
    assert said and "requeued (attempt 1)" in said, said
    rank_log = (job.run_dir / "logs" / "rank-0.log").read_text()
    assert "attempt 0 on " in rank_log and "attempt 1 on " in rank_log
    assert "hpcsuite: attempt 0 preempted after saving a checkpoint" in job.log.read_text()
    records = [json.loads(l) for l in (job.run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in records] == [0, 1]
    assert json.loads((job.run_dir / "results.json").read_text())["attempt"] == 1
