"""The Debian 13 tier's end-to-end core (`make test-debian13`, scripts/debian13.sh): on Slurm 24.11,
Open MPI 5, PMIx 5 and Python 3.13, the quickstart under mpirun and under srun, Slurm's own requeue
of a running job, a sweep array, `status` and sacct read back, and a study point, all with the
TensorFlow backend (PyPI's torch for Python 3.13 is a multi-GB CUDA build; tensorflow-cpu's is
260 MB). Skipped outside that root: the bookworm suite covers the same paths with both frameworks."""

import importlib.util
import json
import os
import subprocess
import time

import pytest

from conftest import REPO, SBATCH, run_cli, submit_spec

pytestmark = [
    pytest.mark.e2e, pytest.mark.timeout(900),
    pytest.mark.skipif(os.environ.get("HPCSUITE_TIER") != "debian13",
                       reason="the Debian 13 tier runs these: make test-debian13"),
]

QUICKSTART = (SBATCH / "quickstart.yaml").read_text().replace("backend: torch", "backend: tensorflow")
assert "backend: tensorflow" in QUICKSTART


@pytest.fixture(scope="module")
def debian13(local_cluster):
    """The local cluster, and its clients' environment with the cluster's own site profile
    (`cluster up` writes mpi.flavour: openmpi5 there, the MPI on this root's PATH)."""
    cluster, env = local_cluster
    return cluster, {**env, **cluster.client_env()}


def slurms_end(read, what: str) -> list[dict]:
    """``read()`` (rows with a Slurm "state") until none is RUNNING or COMPLETING, at most 60 s:
    `sweep run --wait` and `study run --wait` return once the results are in, and Slurm's end
    follows (printed: 1.7 s for the study point here)."""
    t0 = time.monotonic()
    rows = read()
    while any(r["state"] in ("RUNNING", "COMPLETING") for r in rows) and time.monotonic() - t0 < 60:
        time.sleep(1)
        rows = read()
    print(f"{what}: Slurm's end {time.monotonic() - t0:.1f} s after --wait returned")
    return rows


def sacct_state(env: dict, job_id: str) -> str:
    """The job's state as Slurm's accounting (slurmdbd) recorded it."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
                         env=env, capture_output=True, text=True, check=True).stdout
    return out.strip()


def test_the_tier_is_debian13_with_slurm_24_11_open_mpi_5_and_python_3_13(debian13):
    _, env = debian13
    release = open("/etc/os-release").read()
    assert 'VERSION_CODENAME=trixie' in release, release
    sbatch = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, env=env).stdout
    assert " 24.11." in sbatch, sbatch                          # "slurm-wlm 24.11.5"
    mpirun = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    assert mpirun.startswith("mpirun (Open MPI) 5."), mpirun
    mpi_list = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, env=env)
    assert "pmix" in mpi_list.stdout + mpi_list.stderr


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_quickstart_under_both_launchers_then_status_and_sacct(debian13, tmp_path, launcher):
    cluster, env = debian13
    spec = QUICKSTART.replace("launcher: mpirun", f"launcher: {launcher}")
    out = submit_spec(env, tmp_path, spec, "--timeout", "600")
    results = out["results"]
    assert results["world_size"] == 2 and sorted(results["hosts"]) == ["node1", "node2"]
    assert results["steps"] == 3 * 64                           # 8192 / (2*64) per epoch
    assert len(set(results["param_checksums"])) == 1            # Horovod kept the ranks equal
    losses = results["loss"]
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    versions = results["versions"]
    assert " 24.11." in versions["slurm"] and versions["python"].startswith("3.13"), versions
    assert "Open MPI v5" in versions["mpi"] or "Open MPI 5" in versions["mpi"], versions["mpi"]
    assert versions["tensorflow"] and versions["horovod"]
    job_id = out["job_id"]
    status = json.loads(run_cli("status", job_id, "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    assert status["state"] == "COMPLETED", status
    assert sacct_state(env, job_id) == "COMPLETED|0:0"
    logs = run_cli("logs", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert "hpcsuite train: completed at step 192" in logs


def test_slurms_requeue_of_a_running_job_resumes_and_loses_nothing(debian13, tmp_path):
    """`scontrol requeue` (SIGTERM to every process, no warning signal) mid-training: the
    attempt is preempted at its checkpoint, the next resumes there, every sample once."""
    cluster, env = debian13
    spec = importlib.util.spec_from_file_location("preemption_trials",
                                                  REPO / "bench" / "preemption_trials.py")
    trials = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trials)
    # The trial's own length (8000 samples x 24 epochs): 4000 x 16 trained in under the 0-3 s
    # of its random moment on an idle machine, so the requeue came after the end (CI's run).
    r = trials.trial(env, cluster, tmp_path, preemptions=1, seed=0, backend="tensorflow",
                     moments=("random",), routes=("requeue",))
    assert r["routes"] == ["requeue"] and r["clean"], r["problems"]
    run_dir = tmp_path / "runs" / "trial" / r["job_id"]
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(a["attempt"], a["outcome"]) for a in records] == [(0, "preempted"), (1, "completed")]
    results = json.loads((run_dir / "results.json").read_text())
    # saved where Slurm's TERM stopped it: prterun holds TERM (hold_term), the ranks get Slurm's
    # own TERM or the batch shell's forward of it as the preemption signal (USR1), which came first
    first = results["attempts"][0]
    assert first["stop"]["signal"] in ("TERM", "USR1") and first["stop"]["saved"], first
    assert records[0]["step"] == first["final_step"] == results["attempts"][1]["start_step"]
    assert sacct_state(env, r["job_id"]) == "COMPLETED|0:0"
    assert results["history"]["steps"] == list(range(1, results["final_step"] + 1))


SWEEP_JOB = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  backend: tensorflow
  model: mlp
  data: {kind: synthetic, samples: 512, shape: [16], classes: 4}
  eval: {split: 0.25}
  batch_size: 32
  epochs: 1
"""
SWEEP = """name: lrs
base: job.yaml
axes:
  train.lr: [0.01, 0.2]
max_parallel: 2
metric: {name: val_accuracy, goal: max}
"""


def test_a_sweep_runs_as_one_array(debian13, tmp_path):
    _, env = debian13
    (tmp_path / "job.yaml").write_text(SWEEP_JOB)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    proc = run_cli("sweep", "run", "sweep.yaml", "--wait", "--json", cwd=tmp_path, env=env,
                   timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["elements"]
    assert [r["done"] for r in rows] == [True, True]
    sweep_dir = tmp_path / "sweeps" / "lrs"
    array = json.loads((sweep_dir / "submissions.jsonl").read_text())["array_job_id"]
    assert "#SBATCH --array=0-1%2\n" in (sweep_dir / "scripts" / f"{array}.sbatch").read_text()
    runs = slurms_end(lambda: json.loads(run_cli("runs", "--json", cwd=tmp_path, env=env,
                                                 check=True).stdout)[1:], "sweep")
    runs = json.loads(run_cli("runs", "--json", cwd=tmp_path, env=env, check=True).stdout)
    assert [r["job_id"] for r in runs] == [array, f"{array}_0", f"{array}_1"]
    assert [r["state"] for r in runs[1:]] == ["COMPLETED", "COMPLETED"]
    for i in range(2):
        assert sacct_state(env, f"{array}_{i}") == "COMPLETED|0:0"


STUDY_JOB = """name: tiny
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  backend: tensorflow
  model: mlp
  data: {kind: synthetic, samples: 512, shape: [16], classes: 4}
  batch_size: 16
"""
STUDY = """name: tiny
base: job.yaml
axes: {nodes: [2]}
repeats: 1
warmup_steps: 2
steps: 5
limit: false
allreduce_bench: false
"""


def test_a_study_point(debian13, tmp_path):
    _, env = debian13
    (tmp_path / "job.yaml").write_text(STUDY_JOB)
    (tmp_path / "study.yaml").write_text(STUDY)
    proc = run_cli("study", "run", "study.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = slurms_end(lambda: [{**s, "state": s["slurm"]} for s in json.loads(run_cli(
        "study", "status", "studies/tiny", "--json", cwd=tmp_path, env=env, check=True).stdout)],
        "study point")
    assert [(s["point"], s["status"], s["slurm"]) for s in status] == [("p00-r0", "done", "COMPLETED")]
    assert status[0]["slurm_from"] != "state.json"              # Slurm's own word
    report = json.loads(run_cli("study", "report", "studies/tiny", "--json", cwd=tmp_path,
                                env=env, check=True, timeout=300).stdout)
    assert [r["ranks"] for r in report["rows"]] == [2]
    assert report["rows"][0]["throughput"]["median"] > 0
