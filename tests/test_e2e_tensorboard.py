"""End to end on the local Slurm cluster: train.monitor.tensorboard's event files, read back by
TensorBoard's own reader (EventAccumulator). A 2-rank managed-loop job, PyTorch and TensorFlow
(only rank 0 writes; the loss, learning rate and validation TensorBoard shows are results.json's
numbers), and a script-mode job preempted and requeued (one log directory: the run continues).
The torch job and the script job are the shared ones of tests/shared_observe.py."""

import json

import pytest

from conftest import run_cli
from shared_observe import PREEMPTED_STEPS, submitted
from test_tensorboard import f32, points, read

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


# TensorFlow's; torch's is the shared observability job, with the same observers on.
MANAGED_TF = """name: tbm
resources: {nodes: 2, time: "00:05:00"}
train:
  backend: tensorflow
  model: mlp
  data: {samples: 2048, shape: [32]}
  batch_size: 32
  epochs: 20
  eval: {split: 0.1}
  schedule: {decay: cosine}
  monitor: {enabled: true, interval_seconds: 0.2, tensorboard: true}
"""


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_managed_job_charts_what_results_json_records(request, local_cluster, tmp_path,
                                                        backend):
    cluster, env = local_cluster
    job = request.getfixturevalue("observed_job") if backend == "torch" else \
        submitted(env, tmp_path, "tbm", MANAGED_TF)
    r = job.payload["results"]
    run_dir = job.run_dir
    files = sorted((run_dir / "tensorboard").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    assert f".{r['hosts'][0]}." in files[0].name          # rank 0's, no other rank's

    acc = read(run_dir / "tensorboard")
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "learning_rate", "throughput/samples_per_s", "validation/loss",
            "validation/accuracy", "utilisation/rank0/cpu_percent",
            "utilisation/rank1/cpu_percent", "utilisation/rank1/memory_mib"} <= tags, tags

    final = r["final_step"]
    loss = points(acc, "loss")
    steps = [s for s, _ in loss]
    assert steps == sorted(set(steps)) and steps[0] >= 1 and steps[-1] == final
    assert len(steps) >= 3                        # live points, not only the last
    # Every point is the global mean over both ranks that results.json has for its step.
    assert loss == [(s, f32(r["loss"][s - 1])) for s in steps]
    assert points(acc, "learning_rate") == [(s, f32(r["lr"][s - 1])) for s in steps]
    assert all(v > 0 for _, v in points(acc, "throughput/samples_per_s"))
    assert points(acc, "validation/loss") == [(e["step"], f32(e["loss"])) for e in r["eval"]]
    assert points(acc, "validation/accuracy") == [(e["step"], f32(e["accuracy"])) for e in r["eval"]]
    cpu1 = points(acc, "utilisation/rank1/cpu_percent")
    assert len(cpu1) == len(r["utilisation"][1]) and cpu1[-1][0] == final

    report = run_cli("report", job.name, "--out", str(tmp_path / "plots"), cwd=job.work, env=env,
                     check=True).stdout
    assert f"tensorboard --logdir {(run_dir / 'tensorboard').absolute()}" in report, report


def test_a_requeued_script_job_continues_in_one_log_directory(preempted_script_job,
                                                              local_cluster, tmp_path):
    """The shared preempted script job (tests/shared_observe.py), charted."""
    _, env = local_cluster
    job = preempted_script_job
    assert job.state["state"] == "COMPLETED", job.log.read_text()[-3000:]
    run_dir = job.run_dir

    r = json.loads((run_dir / "results.json").read_text())
    total, cut = PREEMPTED_STEPS, r["start_step"]     # cut: where attempt 0 saved and stopped
    assert (r["attempt"], r["final_step"]) == (1, total) and 5 <= cut < total
    assert len(list((run_dir / "tensorboard").iterdir())) == 2      # one file per attempt

    acc = read(run_dir / "tensorboard")
    loss = points(acc, "loss")
    steps = [s for s, _ in loss]
    assert steps == sorted(set(steps)), steps         # one run, going on: no step twice
    assert steps[0] == 1 and steps[-1] == total
    assert any(s <= cut for s in steps) and any(s > cut for s in steps)
    assert loss == [(s, f32(10.0 / s)) for s in steps]
    assert points(acc, "seen") == [(s, float(s)) for s in steps]   # the restored state went on
    assert loss[-1] == (r["final_step"], f32(r["loss"][-1]))
    report = run_cli("report", job.job_id, "--out", str(tmp_path / "plots"), cwd=job.work,
                     env=env, check=True).stdout
    assert "TensorBoard event files (2 attempts, rank 0's)" in report, report
