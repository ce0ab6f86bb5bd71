"""End to end on the local Slurm cluster: both backends, resume, world-size change, preemption.

A per-rank ledger of sample ids (train.ledger) proves that across stops and resumes every
sample of every epoch is trained on exactly once."""

import collections
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import rank_pids, run_cli, submit_spec as submit, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def ledger(run_dirs) -> dict[int, collections.Counter]:
    """{epoch: Counter(sample id -> times trained)} over every rank and attempt."""
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for d in run_dirs:
        for f in (Path(d) / "ledger").glob("rank-*.txt"):
            for line in f.read_text().splitlines():
                epoch, _step, *ids = line.split()
                seen[int(epoch)].update(int(i) for i in ids)
    return seen


def assert_each_sample_once(run_dirs, samples, epochs):
    seen = ledger(run_dirs)
    assert sorted(seen) == list(range(epochs))
    for epoch, counts in seen.items():
        assert set(counts) == set(range(samples)), f"epoch {epoch}: samples missing"
        assert set(counts.values()) == {1}, f"epoch {epoch}: samples repeated"


TF_SPEC = """name: tf2
resources: {nodes: 2, tasks_per_node: 1}
train:
  backend: tensorflow
  model: resnet
  data: {samples: 1024, shape: [3, 8, 8], classes: 4}
  batch_size: 32
  epochs: 4
  lr: 0.05
  grad_accumulation: 2
  checkpoint: {every_steps: 5}
  ledger: true
"""


def test_tensorflow_resnet_two_ranks_and_resume(local_cluster, tmp_path):
    cluster, env = local_cluster
    first = submit(env, tmp_path, TF_SPEC, "--set", "train.max_steps=6")["results"]
    assert first["world_size"] == 2 and first["final_step"] == 6 and first["status"] == "completed"
    assert len(set(first["param_checksums"])) == 1
    assert first["versions"]["tensorflow"].startswith("2.21") and first["versions"]["keras"]
    second = submit(env, tmp_path, TF_SPEC)["results"]
    assert second["resumed_from"].endswith("step-00000006") and second["start_step"] == 6
    steps_per_epoch = 1024 // (2 * 32 * 2)
    assert second["final_step"] == 4 * steps_per_epoch
    assert len(set(second["param_checksums"])) == 1
    losses = first["loss"] + second["loss"]
    assert sum(losses[-4:]) < sum(losses[:4])
    runs = [d for d in (tmp_path / "runs" / "tf2").iterdir() if d.name.isdigit()]
    assert_each_sample_once(runs, 1024, 4)


TORCH_SPEC = """name: resume
resources: {nodes: 2, tasks_per_node: 1}
train:
  backend: torch
  model: mlp
  data: {samples: 1000, shape: [16], classes: 5}
  batch_size: 24
  epochs: 3
  lr: 0.05
  horovod: {compression: fp16}
  checkpoint: {every_steps: 4, keep: 2}
  ledger: true
"""


def test_torch_stop_resume_and_shrink_to_one_rank(local_cluster, tmp_path):
    """2 ranks stop after step 9 (checkpoint saved), 1 rank resumes and finishes."""
    cluster, env = local_cluster
    first = submit(env, tmp_path, TORCH_SPEC, "--set", "train.max_steps=9")["results"]
    assert (first["world_size"], first["final_step"]) == (2, 9)
    assert first["checkpoints"][-1]["step"] == 9 and first["checkpoint_time_s"] > 0
    # Resumed at 1 rank, with submit --wait's text summary: the change of world is said there,
    # in the job's log and by status, and one rank is not told its parameters agree.
    (tmp_path / "job.yaml").write_text(TORCH_SPEC)
    proc = run_cli("submit", "job.yaml", "--wait", "--set", "resources.nodes=1", cwd=tmp_path,
                   env=env, timeout=800, check=True)
    run_dir = Path(proc.stdout.split("run directory ", 1)[1].split()[0])
    second = json.loads((run_dir / "results.json").read_text())
    said = ("resumed from 2 to 1 ranks at step 9: global batch 48 -> 24 samples per step; "
            "train.epochs bounds the run, so each epoch still trains every sample once, in 2x "
            "the steps it took before")
    assert said in proc.stdout and "parameters:" not in proc.stdout, proc.stdout
    assert second["world_change"]["from_ranks"] == 2 and second["world_change"]["to_ranks"] == 1
    assert said in next(run_dir.parent.glob(f"slurm-{run_dir.name}.out")).read_text()
    assert said in run_cli("status", run_dir.name, cwd=tmp_path, env=env, check=True).stdout
    assert second["world_size"] == 1 and second["start_step"] == 9
    assert second["resumed_from"].endswith("step-00000009")
    assert second["loss"][0] < first["loss"][0]          # it continued, it did not restart
    runs = [d for d in (tmp_path / "runs" / "resume").iterdir() if d.name.isdigit()]
    assert_each_sample_once(runs, 1000, 3)
    kept = sorted(p.name for p in (tmp_path / "runs" / "resume" / "checkpoints").glob("step-*"))
    assert len(kept) == 2 and kept[-1] == f"step-{second['final_step']:08d}"


PREEMPT_SPEC = """name: preempt
resources: {nodes: 2, tasks_per_node: 1, time: "00:10:00"}
train:
  data: {samples: 1000000, shape: [8], classes: 4}
  batch_size: 16
  epochs: 1
  max_steps: 8000
  checkpoint: {every_steps: 100000}
  preemption: {signal: USR1, lead_seconds: 60, requeue: true}
  ledger: true
"""


def test_preemption_checkpoints_requeues_and_resumes(preempted_job):
    """The preemption page's job (shared_preempt.preempted_job: sbatch/preemptible.yaml on 2
    ranks, with a ledger), given USR1 mid-run: it saves, requeues itself and resumes to the
    end, and across the two attempts every sample of every epoch is trained exactly once."""
    job = preempted_job
    assert job.state["state"] == "COMPLETED", job.log.read_text()[-3000:]
    text = job.log.read_text()
    assert "hpcsuite train: preempted at step" in text and "requeueing job" in text
    spec = yaml.safe_load(job.spec.read_text())
    resources, train = spec["resources"], spec["train"]
    samples, epochs = train["data"]["samples"], train["epochs"]
    ranks = resources["nodes"] * resources["tasks_per_node"]
    steps = epochs * math.ceil(samples / (ranks * train["batch_size"]))   # padded last step
    results = json.loads((job.run_dir / "results.json").read_text())
    assert results["attempt"] == 1 and results["status"] == "completed"
    assert 0 < results["start_step"] < steps and results["final_step"] == steps
    # runs: Slurm says COMPLETED; the job's own record says how it got there.
    row = next(r for r in json.loads(run_cli("runs", "--json", cwd=job.work, env=job.env,
                                             check=True).stdout) if r["job_id"] == job.job_id)
    assert (row["state"], row["outcome"]) == ("COMPLETED", "completed after 2 attempts (1 preempted)")
    # Every sample id trained at most once, and exactly the whole run's worth: each epoch's
    # samples once, across the stop and the resume.
    assert_each_sample_once([job.run_dir], samples, epochs)


def test_preempted_without_requeue_exits_3_and_resubmission_resumes(local_cluster, tmp_path):
    cluster, env = local_cluster
    text = PREEMPT_SPEC.replace("requeue: true", "requeue: false").replace("name: preempt", "name: stop")
    spec = tmp_path / "stop.yaml"
    spec.write_text(text)
    proc = subprocess.Popen(
        [os.sys.executable, "-m", "hpcsuite", "submit", str(spec), "--wait"], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = tmp_path / "runs" / "stop"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(root.glob("slurm-*.out")):
        time.sleep(0.2)
    log = next(root.glob("slurm-*.out"))
    job_id = log.stem.split("-")[1]
    wait_for_text(log, "training:")
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 3, out + err
    assert "stopped early after saving a checkpoint at step " in err and "submit the same spec again" in err
    again = submit(env, tmp_path, text, name="stop.yaml")["results"]
    assert again["start_step"] > 0 and again["final_step"] == 8000
    seen = ledger([d for d in root.iterdir() if d.name.isdigit()])[0]
    assert set(seen.values()) == {1} and sum(seen.values()) == 8000 * 2 * 16


def _ends_within(env, job_id: str, since: float, limit: float) -> tuple[str, float]:
    while time.monotonic() - since < limit:
        state = json.loads(run_cli("status", job_id, "--json", env=env, check=True).stdout)
        if state["state"] not in ("RUNNING", "PENDING", "COMPLETING"):
            return state["state"], time.monotonic() - since
        time.sleep(1)
    subprocess.run(["scancel", job_id], env=env, timeout=60)
    return "still running", time.monotonic() - since


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_a_dead_rank_ends_the_job_within_a_minute(local_cluster, tmp_path, launcher):
    """kill -9 of one rank: mpirun aborts the job, and under srun --kill-on-bad-exit does
    (without it the survivor would wait in its allreduce until Horovod's stall shutdown, 120 s)."""
    cluster, env = local_cluster
    spec = tmp_path / "dead.yaml"
    spec.write_text(PREEMPT_SPEC.replace("name: preempt", f"name: dead-{launcher}\nlauncher: {launcher}")
                    .replace("max_steps: 8000", "max_steps: 10000000"))
    job_id = run_cli("submit", str(spec), cwd=tmp_path, env=env, check=True).stdout.strip()
    log = tmp_path / "runs" / f"dead-{launcher}" / f"slurm-{job_id}.out"
    wait_for_text(log, "training:")
    pids = rank_pids(str(tmp_path / "runs" / f"dead-{launcher}" / job_id))
    assert len(pids) == 2, pids
    killed_at = time.monotonic()
    os.kill(int(pids[-1]), signal.SIGKILL)
    state, took = _ends_within(env, job_id, killed_at, 90)
    assert state == "FAILED" and took < 60, (state, took, log.read_text()[-2000:])


def test_a_stuck_rank_ends_the_job_through_horovods_stall_shutdown(local_cluster, tmp_path):
    """A rank stuck in its own code (here: sleeping at step 20, as a hung data loader would)
    while the other waits in its allreduce: Horovod's background threads keep negotiating, the
    stall check names the missing rank and the stall shutdown ends the job. (A rank stopped
    outright, SIGSTOP, is not caught this way: the coordinator then blocks inside the MPI
    negotiation itself; only the time limit ends such a job.)"""
    cluster, env = local_cluster
    (tmp_path / "stuck.py").write_text(
        "import time, horovod.torch as hvd, torch\n"
        "from hpcsuite import api\n"
        "hvd.init(); torch.set_num_threads(1)\n"
        "run = api.Run(hvd)\n"
        "x = torch.ones(1000)\n"
        "for step in range(1000000):\n"
        "    if step == 20 and hvd.rank() == 1:\n"
        "        print('rank 1 is stuck', flush=True)\n"
        "        time.sleep(3600)\n"
        "    hvd.allreduce(x, name='grad')\n")
    (tmp_path / "stuck.yaml").write_text(
        "name: stuck\nresources: {nodes: 2, time: '00:10:00'}\n"
        "train: {script: stuck.py, horovod: {stall_check_seconds: 5, stall_shutdown_seconds: 15}}\n")
    job_id = run_cli("submit", "stuck.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    log = tmp_path / "runs" / "stuck" / f"slurm-{job_id}.out"
    wait_for_text(log, "rank 1 is stuck")
    state, took = _ends_within(env, job_id, time.monotonic(), 120)
    text = log.read_text()
    assert state == "FAILED" and 10 < took < 60, (state, took, text[-2000:])
    assert "Missing ranks:" in text, text[-2000:]              # Horovod's stall inspector


def test_torch_npy_shards_amp_adasum_timeline(local_cluster, tmp_path):
    """Memory-mapped npy shards through DataLoader workers, bf16 autocast on the CPU, Adasum,
    gradient accumulation, and a Horovod timeline requested through the spec."""
    import numpy as np

    from hpcsuite.runtime.input.data import write_shards

    cluster, env = local_cluster
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 12)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
    write_shards(tmp_path / "shards", x, y, shards=3)
    spec = f"""name: npy
resources: {{nodes: 2, tasks_per_node: 1}}
train:
  data: {{kind: npy, path: {tmp_path / 'shards'}, workers: 1, prefetch: 2}}
  batch_size: 20
  epochs: 4
  lr: 0.1
  precision: amp
  grad_accumulation: 2
  horovod: {{op: adasum, timeline: true}}
  ledger: true
"""
    payload = submit(env, tmp_path, spec)
    r = payload["results"]
    assert r["world_size"] == 2 and r["precision"] == "amp" and r["dataset_samples"] == 600
    # The training step's forward ran in bf16 (autocast on the CPU), the parameters stay fp32.
    assert r["precision_seen"] == {"compute_dtype": "bfloat16", "param_dtype": "float32",
                                   "loss_scaling": False}
    assert len(set(r["param_checksums"])) == 1
    assert sum(r["loss"][-3:]) < sum(r["loss"][:3])
    run_dir = Path(payload["run_dir"])
    assert (run_dir / "horovod-timeline.json").stat().st_size > 0
    assert_each_sample_once([run_dir], 600, 4)


def test_tensorflow_mixed_float16(local_cluster, tmp_path):
    cluster, env = local_cluster
    spec = """name: tfmixed
resources: {nodes: 2, tasks_per_node: 1}
train: {backend: tensorflow, model: mlp, precision: mixed_float16, batch_size: 32, epochs: 2,
        lr: 0.1, data: {samples: 2048, workers: 2}}
"""
    r = submit(env, tmp_path, spec)["results"]
    assert r["precision"] == "mixed_float16" and len(set(r["param_checksums"])) == 1
    # Computed in float16 with float32 variables, through a loss-scale optimizer.
    assert r["precision_seen"] == {"compute_dtype": "float16", "param_dtype": "float32",
                                   "loss_scaling": True}
    assert sum(r["loss"][-5:]) < sum(r["loss"][:5])
