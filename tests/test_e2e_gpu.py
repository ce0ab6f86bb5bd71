"""GPU placement without a GPU: a local cluster whose nodes declare 2 GPUs each to Slurm (gres
gpu, backed by device files in the cluster's directory). Slurm grants what the header asks
for, and every rank of a 2 x 2 job reports, from inside the user's script, that it sees
exactly its own device: under mpirun (hpcsuite narrows CUDA_VISIBLE_DEVICES by local rank),
under srun with gpus_per_task (Slurm does) and with gpu_bind single:1, and with a site that
asks for GPUs as --gres. The GPU path of the backends themselves (CUDA devices, NCCL, AMP)
is tested in tests/test_gpu.py wherever a GPU is present."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import TEST_PORT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# What a user's script sees: no framework, no Horovod, so four ranks start in a second.
SEEN = """import json, os
from pathlib import Path
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["SLURM_PROCID"]
Path(os.environ["HPCSUITE_RUN_DIR"], f"seen-{rank}.json").write_text(json.dumps({
    "node": os.environ["SLURMD_NODENAME"], "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "local": os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("SLURM_LOCALID")}))
"""


@pytest.fixture(scope="module")
def gpu_cluster(wide_cluster):
    """The session's wide cluster (2 GPUs a node) and its profile."""
    from conftest import cancel_all

    yield wide_cluster, dict(os.environ, **wide_cluster.client_env())   # and its profile
    cancel_all(wide_cluster)


def submit(env, work, spec, *args):
    (work / "seen.py").write_text(SEEN)
    (work / "job.yaml").write_text(spec)
    proc = run_cli("submit", "job.yaml", "--wait", "--json", *args, cwd=work, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    run_dir = work / out["run_dir"]            # relative to the submit directory, or absolute
    seen = {int(p.name[5:-5]): json.loads(p.read_text()) for p in run_dir.glob("seen-*.json")}
    return out, seen


SPEC = """name: {name}
launcher: {launcher}
resources: {{nodes: 2, tasks_per_node: 2, partition: debug, {gpus}}}
train: {{script: seen.py}}
"""


@pytest.mark.parametrize("name, launcher, gpus, how", [
    ("per-node-mpirun", "mpirun", "gpus_per_node: 2", "own of the node's 0,1"),
    ("per-node-srun", "srun", "gpus_per_node: 2", "own of the node's 0,1"),
    ("per-task-srun", "srun", "gpus_per_task: 1", "as Slurm gave it"),
    ("bind-single-srun", "srun", "gpus_per_node: 2, binding: {gpu_bind: 'single:1'}",
     "as Slurm gave it"),
])
def test_each_rank_sees_exactly_its_own_gpu(gpu_cluster, tmp_path, name, launcher, gpus, how):
    cluster, env = gpu_cluster
    out, seen = submit(env, tmp_path, SPEC.format(name=name, launcher=launcher, gpus=gpus))
    assert sorted(seen) == [0, 1, 2, 3], seen
    by_node = {}
    for rank, s in seen.items():
        assert s["visible"] == s["local"], (rank, s)          # one device: its local rank's
        by_node.setdefault(s["node"], []).append(s["visible"])
    assert {n: sorted(v) for n, v in by_node.items()} == {"node1": ["0", "1"], "node2": ["0", "1"]}
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / name).glob("*/logs/rank-*.log"))
    assert logs.count("GPU placement: local rank") == 4 and how in logs, logs
    shown = subprocess.run(["scontrol", "show", "job", out["job_id"]], env=env,
                           capture_output=True, text=True).stdout
    assert "gpu" in shown, shown


def test_a_site_that_asks_for_gres(gpu_cluster, tmp_path):
    cluster, env = gpu_cluster
    profile = tmp_path / "profile.yaml"
    profile.write_text(cluster.profile.read_text() + "gpu_request: gres\n")
    env = dict(env, HPCSUITE_PROFILE=str(profile))
    out, seen = submit(env, tmp_path, SPEC.format(name="gres", launcher="mpirun",
                                                 gpus="gpus_per_node: 2"))
    script = next((tmp_path / "runs" / "gres").glob("*/job.sbatch")).read_text()
    assert "#SBATCH --gres=gpu:2\n" in script and "--gpus-per-node" not in script
    shown = subprocess.run(["scontrol", "show", "job", out["job_id"]], env=env,
                           capture_output=True, text=True).stdout
    assert "TresPerNode=gres:gpu:2" in shown, shown
    assert sorted(s["visible"] for s in seen.values()) == ["0", "0", "1", "1"]


def test_lint_refuses_gpus_per_task_under_mpirun(gpu_cluster, tmp_path):
    """Measured on this cluster: mpirun's one daemon per node gets gpus_per_task GPUs, so both
    ranks of a node would see the same one. Refused before sbatch, naming the key."""
    cluster, env = gpu_cluster
    (tmp_path / "seen.py").write_text(SEEN)
    (tmp_path / "job.yaml").write_text(SPEC.format(name="bad", launcher="mpirun",
                                                   gpus="gpus_per_task: 1"))
    proc = run_cli("submit", "job.yaml", cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: job.yaml: resources.gpus_per_task: with launcher mpirun")
    assert len(proc.stderr.strip().splitlines()) == 1
    three = SPEC.format(name="three", launcher="srun", gpus="gpus_per_node: 3")
    (tmp_path / "job.yaml").write_text(three)
    proc = run_cli("submit", "job.yaml", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "resources.gpus_per_node: 3 GPUs per node" in proc.stderr


TRAIN_2X2 = """name: {name}
launcher: {launcher}
resources: {{nodes: 2, tasks_per_node: 2, partition: debug, time: "00:05:00"{gpus}}}
train:
  model: mlp
  data: {{kind: synthetic, samples: 2048}}
  batch_size: 64
  epochs: 2
"""


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
@pytest.mark.parametrize("gpus", ["", ", gpus_per_node: 2"], ids=["no-gpus", "gpus"])
def test_two_nodes_of_two_ranks_train(gpu_cluster, tmp_path, launcher, gpus):
    """node1 and node2 are one host: Open MPI's shared-memory segments, named by host, job and
    local rank, collided between them and 2 x 2 jobs crashed in Horovod's init or hung there.
    The cluster's profile (mpi.nodes_share_host) gives each node its own directory."""
    cluster, env = gpu_cluster
    name = f"two-by-two-{launcher}{'-gpus' if gpus else ''}"
    (tmp_path / "job.yaml").write_text(TRAIN_2X2.format(name=name, launcher=launcher, gpus=gpus))
    proc = run_cli("submit", "job.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    run_dir = tmp_path / out["run_dir"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["world_size"] == 4, results
    assert results["final_step"] == 2 * 2048 // (64 * 4), results
    logs = "".join(p.read_text() for p in run_dir.glob("logs/rank-*.log"))
    assert logs.count("Open MPI shared memory of this node in /dev/shm/") == 4, logs
    assert not list(Path("/dev/shm").glob(f"hpcsuite-*-{out['job_id']}-*")), "segments left"
