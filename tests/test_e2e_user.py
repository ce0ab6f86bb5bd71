"""End to end on the local Slurm cluster with the user's own code: the digits example (a user
model and data factory) in both frameworks, a user model checkpointed and resumed with its
learning-rate schedule, HDF5 data, script mode with preemption and requeue, user code that
fails, and a bad reference that never reaches Slurm."""

import json
import shutil
import subprocess
import time

import numpy as np
import pytest

from conftest import REPO, run_cli, submit_spec, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLE = REPO / "examples" / "digits"


@pytest.fixture
def digits(tmp_path):
    work = tmp_path / "digits"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return work


def submit_file(env, work, spec, *args, expect=0):
    proc = run_cli("submit", spec, "--wait", "--json", *args, cwd=work, env=env, timeout=800)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("spec", ["digits-torch.yaml", "digits-tf.yaml"])
def test_digits_example_reaches_a_believable_accuracy(local_cluster, digits, spec):
    cluster, env = local_cluster
    r = submit_file(env, digits, spec)["results"]
    assert r["world_size"] == 2 and r["status"] == "completed" and len(set(r["param_checksums"])) == 1
    final = r["eval"][-1]
    assert final["samples"] == 360 and final["epoch"] == 30
    assert final["accuracy"] > 0.95, r["eval"]
    assert [e["epoch"] for e in r["eval"]] == [5, 10, 15, 20, 25, 30]   # every_epochs: 5


def test_user_model_resumes_and_continues_its_schedule(local_cluster, digits):
    from hpcsuite.runtime.session.schedule import learning_rate
    from hpcsuite.submit.spec import Schedule

    cluster, env = local_cluster
    first = submit_file(env, digits, "digits-torch.yaml", "--set", "train.max_steps=100")["results"]
    assert first["final_step"] == 100 and first["checkpoints"][-1]["step"] == 100
    second = submit_file(env, digits, "digits-torch.yaml")["results"]
    assert second["start_step"] == 100 and second["resumed_from"].endswith("step-00000100")
    assert second["loss"][0] < first["loss"][0] / 3          # it continued, it did not restart
    lrs = first["lr"] + second["lr"]
    steps_per_epoch, n = 23, 1437                            # 1437 samples / (2 ranks x 32)
    sched = Schedule(scale_by_world_size=True, warmup_epochs=2, decay="cosine")
    expected = [learning_rate(sched, 0.002, 2, e + min((s + 1) * 64, n) / n, 30)
                for e in range(30) for s in range(steps_per_epoch)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    # and the second job is the example run to its end (test_digits_example_...[digits-torch]'s
    # checks, which make test-full runs from scratch): two ranks in step, its evals, the bar
    assert second["world_size"] == 2 and second["status"] == "completed"
    assert len(set(second["param_checksums"])) == 1
    final = second["eval"][-1]
    assert final["samples"] == 360 and final["epoch"] == 30
    assert final["accuracy"] > 0.95, second["eval"]
    assert [e["epoch"] for e in second["eval"]] == [5, 10, 15, 20, 25, 30]   # every_epochs: 5


def test_hdf5_data_with_a_validation_split(local_cluster, tmp_path):
    import h5py

    cluster, env = local_cluster
    rng = np.random.default_rng(1)
    x = rng.standard_normal((800, 2, 6)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(np.int64) + 2 * (x[:, 1, 1] > 0)
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["images"], f["classes"] = x, y
    spec = """name: h5
resources: {nodes: 2, tasks_per_node: 1}
train:
  data: {kind: hdf5, path: data.h5, inputs: images, labels: classes, workers: 1}
  eval: {split: 0.2}
  batch_size: 32
  epochs: 8
  lr: 0.1
  ledger: true
"""
    r = submit_spec(env, tmp_path, spec)["results"]
    assert r["dataset_samples"] == 640 and r["eval"][-1]["samples"] == 160
    assert r["eval"][-1]["accuracy"] > 0.8 and len(set(r["param_checksums"])) == 1


@pytest.mark.parametrize("spec", ["digits-script-torch.yaml", "digits-script-tf.yaml"])
def test_script_mode_runs_the_users_script(local_cluster, digits, spec):
    cluster, env = local_cluster
    payload = submit_file(env, digits, spec)
    r = payload["results"]
    assert r["mode"] == "script" and r["status"] == "completed" and r["world_size"] == 2
    assert r["final_step"] == 20 * 23 and len(set(r["param_checksums"])) == 1
    assert r["metrics"]["test_accuracy"] > 0.95
    assert r["checkpoints"][-1]["step"] == r["final_step"]


# Long enough that the signal, a second after the first step, lands mid-run on a busy machine
# (start_step is asserted strictly inside); every step of the rest is trained again after it.
PREEMPT_EPOCHS = 150


@pytest.mark.parametrize("name", ["digits-script-torch", "digits-script-tf"])
def test_script_mode_preemption_requeues_and_resumes(local_cluster, digits, name):
    cluster, env = local_cluster
    job_id = run_cli("submit", f"{name}.yaml", "--set", f"train.epochs={PREEMPT_EPOCHS}",
                     "--set", "train.checkpoint.every_steps=100000", cwd=digits, env=env,
                     check=True).stdout.strip()
    log = digits / "runs" / name / f"slurm-{job_id}.out"
    wait_for_text(log, "step ")                      # training has begun (the first step is logged)
    time.sleep(1)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
    deadline = time.monotonic() + 600
    state = {}
    while time.monotonic() < deadline:
        state = json.loads(run_cli("status", job_id, "--json", env=env, check=True).stdout)
        if state["state"] == "PENDING" and state["reason"] == "BeginTime" \
                and set(cluster.node_states().values()) == {"idle"}:
            time.sleep(2)   # see test_e2e_train: start the requeued job once the nodes are idle
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env)
        if state["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(1)
    text = log.read_text()
    assert state["state"] == "COMPLETED", text[-3000:]
    assert "hpcsuite script: preempted at step" in text and "requeueing job" in text
    r = json.loads((digits / "runs" / name / job_id / "results.json").read_text())
    assert r["attempt"] == 1 and r["status"] == "completed" and r["mode"] == "script"
    assert 0 < r["start_step"] < r["final_step"] == PREEMPT_EPOCHS * 23
    assert r["resumed_from"] and len(set(r["param_checksums"])) == 1
    h = r["history"]                                 # the whole job, from its first step
    assert h["steps"] == list(range(1, PREEMPT_EPOCHS * 23 + 1)) and None not in h["loss"]
    assert [a["step"] for a in h["attempt_starts"]] == [1, r["start_step"] + 1]
    assert h["loss"][0] > 3 * h["loss"][-1]          # it learnt across the requeue


RAISES = """
import torch.nn as nn

class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(16, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 3:
            raise ValueError("the user's model broke on call %d" % self.calls)
        return self.layer(x)

def build(shape, classes):
    return Broken()

def wrong_width(shape, classes):
    return nn.Linear(16, 7)
"""


def test_a_failing_user_model_ends_the_job_fast_with_its_traceback(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "net.py").write_text(RAISES)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: broken\nresources: {nodes: 2, tasks_per_node: 1}\n"
                    "train: {model: net.py:build, data: {samples: 100000, shape: [16], classes: 4},"
                    " batch_size: 8}\n")
    t0 = time.monotonic()
    proc = run_cli("submit", str(spec), "--wait", cwd=tmp_path, env=env, timeout=300)
    assert time.monotonic() - t0 < 60 + 30, "the job did not end promptly"
    assert proc.returncode == 1
    log = next((tmp_path / "runs" / "broken").glob("slurm-*.out")).read_text()
    assert log.count("Traceback (most recent call last)") == 1, log
    assert "hpcsuite train: rank" in log and "failed in train.model (net.py:build):" in log
    assert 'net.py", line' in log and "ValueError: the user's model broke on call 4" in log
    assert "hpcsuite/runtime" not in log.split("Traceback (most recent call last)")[1].split("ValueError")[0]


def test_a_model_that_does_not_fit_the_data_says_so_in_one_line(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "net.py").write_text(RAISES)
    spec = "name: width\ntrain: {model: net.py:wrong_width, data: {shape: [16], classes: 4}}\n"
    submit_spec(env, tmp_path, spec, expect=2)      # an input error, as on the login node
    log = next((tmp_path / "runs" / "width").glob("slurm-*.out")).read_text()
    assert ("error: train.model: net.py:wrong_width gives outputs of shape [2, 7] for a batch of 2 "
            "inputs of shape [16]; the data needs [2, 4] (4 classes)") in log
    assert "Traceback" not in log


def test_a_bad_reference_is_refused_before_slurm(local_cluster, tmp_path):
    cluster, env = local_cluster
    before = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    spec = tmp_path / "job.yaml"
    spec.write_text("name: badref\ntrain: {model: net.py:build}\n")
    proc = run_cli("submit", str(spec), cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {spec}: train.model: net.py:build: no file net.py (looked in {tmp_path})")
    after = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    assert before == after and not (tmp_path / "runs").exists()


# The user's code blocks before the first step: a model that never finishes building (a lock,
# a download), and a script whose rank 1 never reaches Horovod's init, so rank 0 waits inside it.
BUILD_HANGS = """import time


def build(shape, classes):
    time.sleep(3600)
"""
INIT_HANGS = """import os
import time

if int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID") or 0) == 1:
    time.sleep(3600)
import horovod.torch as hvd
hvd.init()
"""


def _stalled(env, work, name, launcher, train):
    """Submit a 2-rank job whose ranks never train a step, with a 20 s startup bound and a
    10 min time limit; the seconds until --wait returned, its error line, and `status`'s text."""
    spec = work / f"{name}.yaml"
    spec.write_text(f"name: {name}\nlauncher: {launcher}\n"
                    "resources: {nodes: 2, tasks_per_node: 1, time: '00:10:00'}\n"
                    f"train: {{startup_timeout_seconds: 20, {train}}}\n")
    t0 = time.monotonic()
    proc = run_cli("submit", str(spec), "--wait", cwd=work, env=env, timeout=600)
    took = time.monotonic() - t0
    log = next((work / "runs" / name).glob("slurm-*.out"))
    assert proc.returncode == 1, proc.stdout + proc.stderr + log.read_text()[-3000:]
    job_id = log.name[len("slurm-"):-len(".out")]
    status = run_cli("status", job_id, cwd=work, env=env, check=True).stdout
    headline = next(l for l in proc.stderr.splitlines() if l.startswith("error: "))
    return took, headline, status


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_ranks_that_never_train_a_step_end_the_job_naming_where(local_cluster, tmp_path, launcher):
    cluster, env = local_cluster
    (tmp_path / "net.py").write_text(BUILD_HANGS)
    took, said, status = _stalled(env, tmp_path, f"hangs-{launcher}", launcher,
                                  "model: net.py:build, data: {shape: [16], classes: 4}")
    assert took < 150, took               # 20 s after the ranks started, not the 10 min limit
    expected = ("ranks stopped before the first step: no step within 20 s after they started "
                "(train.startup_timeout_seconds); in net.py:5 in build (ranks 0-1)")
    assert expected in said, said
    assert expected in status and "FAILED" in status, status
    assert "time limit" not in status and "work is lost" not in status, status


def test_a_rank_that_never_reaches_horovods_init_leaves_the_other_inside_it(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "hang.py").write_text(INIT_HANGS)
    took, said, status = _stalled(env, tmp_path, "init-hangs", "mpirun", "script: hang.py")
    assert took < 150, took
    expected = ("ranks stopped before Horovod's init (rank 1), inside Horovod's init (rank 0): "
                "no step within 20 s after they started (train.startup_timeout_seconds); in "
                "hang.py:7 in <module> (rank 0), hang.py:5 in <module> (rank 1)")
    assert expected in said, said
    assert expected in status and "work is lost" not in status, status
