"""End to end on the local Slurm cluster: Slurm's warning signal for a job with nothing to save.

`train.preemption: {signal: USR1, lead_seconds: 60}` without checkpoint keys renders
`#SBATCH --signal=B:USR1@60`; the signal (what Slurm sends lead_seconds before the time limit,
sent here with `scancel --signal=USR1 --batch`) once killed the untrapped batch shell: FAILED,
exit 0:10, no attempt record, and `status` said "checkpoint saved" of a job that saved none.
Now the shell traps it, the ranks stop, and every record says what happened: the stop, its
step, and that no checkpoint exists. A script that never asks run.should_stop() runs on, and
the attempt says so."""

import json
import subprocess

import pytest

from conftest import follow_job, run_cli, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MANAGED = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:10:00"}}
train:
  data: {{samples: 1000000, shape: [8], classes: 4}}
  batch_size: 16
  epochs: 1
  max_steps: 30000
  preemption: {{signal: USR1, lead_seconds: 60}}
"""

SCRIPT_SPEC = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:10:00"}}
train:
  script: {script}
  preemption: {{signal: USR1, lead_seconds: 60}}
"""

# Asks run.should_stop() every step and saves nothing (no checkpoint keys, no run.save()).
STOPS = """
import time
import horovod.torch as hvd
from hpcsuite import api

hvd.init()
run = api.Run(hvd)
for batch in run.batches(10_000_000):
    time.sleep(0.002)
    run.log(loss=1.0)
    if run.should_stop():
        break
run.finish()
"""

# Knows nothing of hpcsuite: a plain Horovod loop that ends by itself after ~15 s.
PLAIN = """
import time
import horovod.torch as hvd

hvd.init()
print("step 1", flush=True)
time.sleep(15)
print("done", flush=True)
"""


def _submit_and_signal(env, tmp_path, name: str, spec_text: str, started: str) -> tuple[str, dict]:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(spec_text)
    lint = run_cli("lint", str(spec), cwd=tmp_path, env=env)
    assert lint.returncode == 0 and "nothing to save" in lint.stdout + lint.stderr, \
        lint.stdout + lint.stderr
    job_id = run_cli("submit", str(spec), cwd=tmp_path, env=env, check=True).stdout.strip()
    log = tmp_path / "runs" / name / f"slurm-{job_id}.out"
    wait_for_text(log, started)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
    return job_id, follow_job(env, job_id, tmp_path)


def _records(tmp_path, name: str, job_id: str) -> list[dict]:
    path = tmp_path / "runs" / name / job_id / "attempts.jsonl"
    assert path.is_file(), "no attempt record"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_warning_signal_stops_a_managed_job_with_nothing_to_save_and_says_so(
        local_cluster, tmp_path):
    cluster, env = local_cluster
    job_id, state = _submit_and_signal(env, tmp_path, "nosave", MANAGED.format(name="nosave"),
                                       "training:")
    log = (tmp_path / "runs" / "nosave" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    [record] = _records(tmp_path, "nosave", job_id)
    assert record["outcome"] == "stopped" and record["signal"] == "USR1"
    assert 0 < record["step"] < 30000 and record["checkpoint_step"] is None
    results = json.loads((tmp_path / "runs" / "nosave" / job_id / "results.json").read_text())
    assert results["status"] == "stopped" and results["checkpoints"] == []
    assert results["final_step"] == record["step"] and results["stop"]["saved"] is False
    assert "without saving a checkpoint; no checkpoint exists" in log
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert f"at step {record['step']}, no checkpoint saved" in status
    # Nowhere a word of a save that never happened.
    assert "checkpoint saved" not in status.replace("no checkpoint saved", "")
    assert "checkpoint saved" not in log.replace("no checkpoint saved", "")


def test_the_warning_signal_stops_a_script_that_asks_and_ends_one_that_cannot(
        local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "stops.py").write_text(STOPS)
    (tmp_path / "plain.py").write_text(PLAIN)
    job_id, state = _submit_and_signal(
        env, tmp_path, "stops", SCRIPT_SPEC.format(name="stops", script="stops.py"),
        "attempt 0 on")
    log = (tmp_path / "runs" / "stops" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    [record] = _records(tmp_path, "stops", job_id)
    assert record["outcome"] == "stopped" and record["checkpoint_step"] is None
    results = json.loads((tmp_path / "runs" / "stops" / job_id / "results.json").read_text())
    assert results["status"] == "stopped" and results["stop"]["saved"] is False
    assert "the script saved none through run.save()" in log

    job_id, state = _submit_and_signal(
        env, tmp_path, "plain", SCRIPT_SPEC.format(name="plain", script="plain.py"), "step 1")
    log = (tmp_path / "runs" / "plain" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED" and "done" in log, log[-3000:]
    [record] = _records(tmp_path, "plain", job_id)
    assert record["outcome"] == "completed" and record["signal"] == "USR1"
    assert "got SIGUSR1 and ran on to its end" in log and "run.should_stop()" in log
