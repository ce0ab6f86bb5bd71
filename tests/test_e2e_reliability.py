"""Reliability end to end on the local Slurm cluster: preemption trials, restart budgets, a node
lost mid-job, the time limit, damaged state, a full disk, concurrent submits and owners."""

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli, submit_spec as submit, wait_for_text
from shared_preempt import LIMIT   # the time-limit job; the busy-directory test makes its job of it

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def bench(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def follow(env, cluster, job_id: str, cwd: Path, timeout: float = 600) -> dict:
    """`hpcsuite status --json` until the job ends, starting a requeued job as soon as both
    nodes are idle again (Slurm otherwise holds it for about two minutes)."""
    trials = bench("preemption_trials")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(run_cli("status", job_id, "--json", cwd=cwd, env=env, check=True).stdout)
        if state["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                              "OUT_OF_MEMORY"):
            return state
        trials.hurry_requeued(env, cluster, job_id, state)
        time.sleep(1)
    raise AssertionError(f"job {job_id} still {state['state']} after {timeout}s")


def test_two_preemptions_in_a_row_lose_and_repeat_nothing(local_cluster, tmp_path):
    """The short version of bench/preemption_trials.py: preempted at a random moment, then
    as soon as the requeued attempt's batch script starts (before its ranks exist)."""
    cluster, env = local_cluster
    trials = bench("preemption_trials")
    r = trials.trial(env, cluster, tmp_path, preemptions=2, seed=0,
                     moments=("random", "startup"))
    assert r["moments"] == ["random", "startup (before the ranks)"]
    assert r["clean"], r["problems"]
    run_dir = tmp_path / "runs" / "trial" / r["job_id"]
    results = json.loads((run_dir / "results.json").read_text())
    assert [a["status"] for a in results["attempts"]] == ["preempted", "preempted", "completed"]
    for a, b in zip(results["attempts"], results["attempts"][1:]):
        assert b["start_step"] == a["final_step"]            # each resumed where the last saved
    first = json.loads((run_dir / "results-attempt-0.json").read_text())
    assert first["stop"]["reason"] == "preempted" and first["stop"]["signal"] == "USR1"
    assert first["stop"]["seconds_after_signal"] < 2.0       # agreed within two votes
    out = run_cli("status", r["job_id"], cwd=tmp_path, env=env, check=True).stdout
    assert "attempts: 3 attempts, 2 preempted or stopped at the time limit; last: attempt 2 " \
           "completed" in out



def test_slurms_own_requeue_is_a_preemption_and_the_whole_run_is_reported(local_cluster, tmp_path):
    """`scontrol requeue` on a running job (as PreemptMode=REQUEUE: SIGTERM to every process,
    no warning signal) with max_failures 0: the attempt is preempted at its checkpoint, not a
    failure; the job resumes and completes, every sample trained exactly once, and
    results.json's history runs over both attempts."""
    cluster, env = local_cluster
    trials = bench("preemption_trials")
    r = trials.trial(env, cluster, tmp_path, preemptions=1, seed=0, moments=("random",),
                     routes=("requeue",))
    assert r["routes"] == ["requeue"] and r["clean"], r["problems"]
    run_dir = tmp_path / "runs" / "trial" / r["job_id"]
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    first = records[0]
    assert (first["attempt"], first["outcome"], first["signal"]) == (0, "preempted", "TERM")
    assert isinstance(first["step"], int) and first["step"] > 0
    assert records[-1]["outcome"] == "completed"
    results = json.loads((run_dir / "results.json").read_text())
    assert [a["status"] for a in results["attempts"]] == ["preempted", "completed"]
    assert results["attempts"][0]["final_step"] == first["step"]
    assert results["attempts"][1]["start_step"] == first["step"]
    history = results["history"]
    assert history["steps"] == list(range(1, results["final_step"] + 1))   # none lost, none twice
    assert [a["attempt"] for a in history["attempt_starts"]] == [0, 1]
    assert history["loss"][0] == results["attempts"][0]["loss_first"]
    log = (tmp_path / "runs" / "trial" / f"slurm-{r['job_id']}.out").read_text()
    assert "attempt 0 preempted on SIGTERM from Slurm" in log and "failure budget" not in log


CRASH = """name: crash
resources: {nodes: 1, tasks_per_node: 1}
train:
  script: crash.py
  checkpoint: {every_steps: 5}
  preemption: {max_failures: 1}
"""


def test_a_job_that_keeps_crashing_is_requeued_up_to_its_budget_then_stops(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "crash.py").write_text("import sys\nprint('crashing')\nsys.exit(1)\n")
    (tmp_path / "crash.yaml").write_text(CRASH)
    job_id = run_cli("submit", "crash.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    state = follow(env, cluster, job_id, tmp_path)
    assert state["state"] == "FAILED"
    log = (tmp_path / "runs" / "crash" / f"slurm-{job_id}.out").read_text()
    assert "attempt 0 failed (exit 1); failure 1 of at most 1" in log and "requeueing" in log
    assert "attempt 1 failed (exit 1); not requeued: 2 failed attempts, more than " \
           "train.preemption.max_failures (1)" in log
    status = json.loads(run_cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert (status["attempts"]["count"], status["attempts"]["failed"]) == (2, 2)
    text = run_cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert "attempts: 2 attempts, 2 failed; last: attempt 1 failed (exit 1)" in text


NODE = """name: node
resources: {nodes: 2, tasks_per_node: 1, time: "00:15:00"}
train:
  data: {samples: 8000, shape: [256], classes: 10}
  batch_size: 32
  epochs: 40
  checkpoint: {every_steps: 50}
  preemption: {max_failures: 1}
  ledger: true
"""


def test_a_node_lost_mid_job_ends_it_promptly_and_it_resumes_when_nodes_return(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "node.yaml").write_text(NODE)
    job_id = run_cli("submit", "node.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    ckpt = tmp_path / "runs" / "node" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(ckpt.glob("step-*")):
        time.sleep(0.2)
    assert list(ckpt.glob("step-*")), "no checkpoint before the node went down"
    t0 = time.monotonic()
    subprocess.run(["scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=test"],
                   env=env, check=True)
    try:
        while time.monotonic() - t0 < 120:
            state = json.loads(run_cli("status", job_id, "--json", env=env, cwd=tmp_path).stdout)
            if state["state"] != "RUNNING":
                break
            time.sleep(0.5)
        ended = time.monotonic() - t0
        assert state["state"] != "RUNNING" and ended < 60, f"still running after {ended:.0f}s"
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], env=env)
    state = follow(env, cluster, job_id, tmp_path)
    assert state["state"] == "COMPLETED"
    run_dir = tmp_path / "runs" / "node" / job_id
    records = [json.loads(l) for l in (run_dir / "attempts.jsonl").read_text().splitlines()]
    # Either the batch script saw the launcher fail (its node survived) and requeued within
    # the budget, or Slurm killed the whole attempt and requeued it (a lost attempt), or
    # Slurm's SIGTERM reached the surviving ranks first and they saved: a stop Slurm made,
    # recorded as a preemption at its step, and Slurm's own requeue runs the next attempt.
    first = records[0]
    assert first["outcome"] in ("failed", "lost", "preempted"), records
    if first["outcome"] == "preempted":
        assert first["signal"] == "TERM" and first["step"] > 0, records
    else:
        assert first.get("requeued") or first.get("why") == "a node failed", records
    assert records[-1]["outcome"] == "completed"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["start_step"] > 0 and results["resumed_from"]
    assert results["final_step"] == 40 * 8000 // 64 and len(set(results["param_checksums"])) == 1
    from hpcsuite.runs import ledger

    assert ledger.exactly_once([run_dir], 8000, 40) == []


def test_a_job_reaching_its_time_limit_saves_first_and_says_so(local_cluster, time_limit_jobs):
    """No preemption settings: the default warning signal and the ranks' own clock. The job is
    shared_preempt.LIMIT (1 node, 2 minutes), run beside the TIMEOUT job of test_e2e_review."""
    cluster, env = local_cluster
    limit = time_limit_jobs.limit
    assert limit.returncode == 3, limit.stdout + limit.stderr
    out = json.loads(limit.stdout)
    results = out["results"]
    assert results["status"] == "time_limit" and results["stop"]["reason"] == "time_limit"
    assert results["checkpoints"][-1]["step"] == results["final_step"] > 0
    assert results["checkpoints"][-1]["reason"] == "time_limit"
    assert out["state"] == "COMPLETED"                    # it ended itself, before Slurm did
    proc = run_cli("status", out["job_id"], cwd=limit.work, env=env, check=True)
    assert f"before the time limit at step {results['final_step']}, checkpoint saved" in proc.stdout


SMALL = """name: small
resources: {nodes: 2, tasks_per_node: 1}
train:
  data: {samples: 2000, shape: [32], classes: 4}
  batch_size: 16
  max_steps: 20
  checkpoint: {every_steps: 10}
"""


def test_damaged_state_is_named_never_a_traceback_or_a_fresh_start(local_cluster, tmp_path):
    cluster, env = local_cluster
    first = submit(env, tmp_path, SMALL, name="small.yaml")
    job_id, run_dir = first["job_id"], Path(first["run_dir"])
    ckpt = tmp_path / "runs" / "small" / "checkpoints"
    # Every checkpoint damaged: the resubmitted job stops with exit 2 naming the newest.
    for d in ckpt.glob("step-*"):
        (d / "model.safetensors").write_bytes(b"torn")
    proc = run_cli("submit", "small.yaml", "--wait", "--set", "train.max_steps=40", cwd=tmp_path,
                   env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr
    headline = next(l for l in proc.stderr.splitlines() if l.startswith("error: "))
    assert "ended FAILED: " in headline and \
        "step-00000020/model.safetensors: 4 bytes, manifest says" in headline, proc.stderr
    assert "no intact checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    # Damaged records of the finished first job: status names the file, exit 2.
    for name, text in [("results.json", '{"job": "small", "final_st'),
                       ("attempts.jsonl", '{"attempt": 0, "outcome": "completed"}\n{"att'),
                       ("job.json", "{not json")]:
        good = (run_dir / name).read_text()
        (run_dir / name).write_text(text)
        proc = run_cli("status", job_id, cwd=tmp_path, env=env)
        assert proc.returncode == 2 and str(run_dir / name) in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        (run_dir / name).write_text(good)


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(local_cluster, tmp_path):
    cluster, env = local_cluster
    disk = tmp_path / "tiny"
    disk.mkdir()
    # Room for one checkpoint of this model (about 270 kB) and not two.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        spec = SMALL.replace("name: small", "name: full").replace(
            "shape: [32]", "shape: [512]").replace("every_steps: 10}", f"every_steps: 10, keep: 2, dir: {disk}}}")
        out = submit(env, tmp_path, spec, name="full.yaml", expect=2)
        log = (tmp_path / "runs" / "full" / f"slurm-{out['job_id']}.out").read_text()
        assert "saving the checkpoint of step 20 failed: No space left on device; the previous " \
               f"checkpoint {disk}/step-00000010 is intact" in log
        from hpcsuite.runtime.session.checkpoint import CheckpointStore

        assert CheckpointStore(disk).latest().step == 10
        assert sorted(p.name for p in disk.iterdir() if not p.name.startswith(".owner")) == \
            ["step-00000010"]
    finally:
        subprocess.run(["umount", str(disk)])


def test_a_second_job_on_a_busy_checkpoint_directory_is_refused(local_cluster, tmp_path):
    """(Fifty submits at once: test_e2e_runs.test_fifty_submits_at_once_are_all_recorded_and_listed.)"""
    cluster, env = local_cluster
    # Two jobs of one name: the second would write the first's checkpoints and is refused.
    busy = LIMIT.replace("name: limit", "name: busy").replace('time: "00:02:00"', 'time: "00:05:00"').replace("nodes: 2", "nodes: 1")
    (tmp_path / "busy.yaml").write_text(busy)
    # A job submitted before anyone owned the directory, released once another owns it.
    (tmp_path / "other.yaml").write_text(busy.replace(
        "every_steps: 100000}", "every_steps: 100000, dir: runs/busy/checkpoints}").replace(
        "name: busy", "name: other"))
    second = run_cli("submit", "other.yaml", "--hold", cwd=tmp_path, env=env, check=True).stdout.strip()
    first = run_cli("submit", "busy.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    try:
        wait_for_text(tmp_path / "runs" / "busy" / f"slurm-{first}.out", "training:")
        # Two jobs of one name: the second would write the first's checkpoints.
        proc = run_cli("submit", "busy.yaml", cwd=tmp_path, env=env)
        assert proc.returncode == 2
        assert f"checkpoint directory in use by job {first} (RUNNING" in proc.stderr
        # The one submitted before: its own start refuses it, and the first runs on.
        subprocess.run(["scontrol", "release", second], env=env, check=True)
        state = follow(env, cluster, second, tmp_path, timeout=300)
        assert state["state"] == "FAILED"
        text = (tmp_path / "runs" / "other" / f"slurm-{second}.out").read_text()
        assert f"checkpoint directory in use by job {first} (RUNNING" in text
        assert json.loads(run_cli("status", first, "--json", cwd=tmp_path, env=env).stdout)["state"] == "RUNNING"
    finally:
        subprocess.run(["scancel", first, second], env=env)
