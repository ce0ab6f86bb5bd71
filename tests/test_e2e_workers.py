"""End to end on the local Slurm cluster: train.data.workers 1 on two ranks over several short
epochs starts one loader worker per rank for the whole run (not one per epoch), trains every
sample once per epoch, and leaves no worker behind; a preemption signal stops the ranks, not
their workers, and the resubmitted job resumes with each sample still trained exactly once."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_cli, submit_spec as submit, wait_for_text
from test_e2e_train import ledger
from test_workers import FACTORY, alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SAMPLES = 512          # 16 steps an epoch on two ranks of 16


def spec(name: str, tmp_path: Path, epochs: int, slow: float = 0.0) -> str:
    (tmp_path / "data.py").write_text(FACTORY)
    return f"""name: {name}
resources: {{nodes: 2, tasks_per_node: 1}}
train:
  data: {{kind: python, factory: data.py:make, workers: 1, prefetch: 2,
          args: {{n: {SAMPLES}, log: {tmp_path / (name + '.opened')}, slow: {slow}}}}}
  batch_size: 16
  epochs: {epochs}
  lr: 0.05
  ledger: true
  checkpoint: {{every_steps: 1000}}
"""


def opened(tmp_path: Path, name: str) -> list[int]:
    return [int(p) for p in (tmp_path / f"{name}.opened").read_text().split()]


def test_one_worker_per_rank_for_six_epochs(local_cluster, tmp_path):
    cluster, env = local_cluster
    payload = submit(env, tmp_path, spec("workers", tmp_path, epochs=6))
    r = payload["results"]
    assert r["status"] == "completed" and r["world_size"] == 2 and r["final_step"] == 6 * 16
    assert len(set(r["param_checksums"])) == 1 and sum(r["loss"][-8:]) < sum(r["loss"][:8])
    seen = ledger([payload["run_dir"]])
    assert sorted(seen) == list(range(6))
    for epoch, counts in seen.items():
        assert set(counts) == set(range(SAMPLES)) and set(counts.values()) == {1}, epoch
    # Two ranks opened the data, then one worker each, once: six epochs started no others.
    pids = opened(tmp_path, "workers")
    assert len(pids) == len(set(pids)) == 4, pids
    assert not [p for p in pids if alive(p)], "a rank or loader worker outlived the job"


def test_preempted_with_workers_resumes_exactly_once(local_cluster, tmp_path):
    cluster, env = local_cluster
    text = spec("stopw", tmp_path, epochs=30, slow=0.5)    # a read per rank an epoch: 15 s
    (tmp_path / "stopw.yaml").write_text(text)
    proc = subprocess.Popen(
        [os.sys.executable, "-m", "hpcsuite", "submit", "stopw.yaml", "--wait"], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = tmp_path / "runs" / "stopw"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(root.glob("slurm-*.out")):
        time.sleep(0.2)
    log = next(root.glob("slurm-*.out"))
    job_id = log.stem.split("-")[1]
    wait_for_text(log, "training:")
    deadline = time.monotonic() + 120
    while len(opened(tmp_path, "stopw")) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)                                 # both ranks' workers are reading
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 3, out + err
    first = json.loads((root / job_id / "results.json").read_text())
    assert first["status"] == "preempted" and 0 < first["final_step"] < 30 * 16
    text_log = log.read_text()
    assert "exited unexpectedly" not in text_log and "ended unexpectedly" not in text_log
    again = submit(env, tmp_path, text, name="stopw.yaml")["results"]
    assert again["start_step"] == first["final_step"] and again["final_step"] == 30 * 16
    seen = ledger([d for d in root.iterdir() if d.name.isdigit()])
    assert sorted(seen) == list(range(30))
    for epoch, counts in seen.items():
        assert set(counts) == set(range(SAMPLES)) and set(counts.values()) == {1}, epoch
    pids = opened(tmp_path, "stopw")
    assert len(pids) == 8, pids                         # two attempts, two ranks, a worker each
    assert not [p for p in pids if alive(p)], "a rank or loader worker outlived the job"
