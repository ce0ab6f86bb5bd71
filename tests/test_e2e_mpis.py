"""End to end with other MPIs (issue 43, points 3 and 5): Open MPI 5 and MPICH from PyPI, each
with the Horovod built against it in its own venv and the site profile `scripts/setup.sh --mpi
NAME` writes (examples/sites/NAME/profile.yaml), on the local Slurm cluster:

- the quickstart under the MPI's own launcher (Open MPI 5's mpirun, MPICH's Hydra mpiexec) and
  under srun (--mpi=pmix for Open MPI 5, pmi2 for MPICH, as `srun --mpi=list` offers);
- per MPI and launcher one 2x2 job (two nodes of two ranks: the cluster is started with
  `--gpus 2`, a core per GPU) whose rank 1 is slow all along and is named, preempted by the
  warning signal, requeued by Slurm and completed from its checkpoint;
- a profile naming an MPI the job's Horovod was not built against: the rank stops before
  hvd.init() with one line naming mpi.flavour and `scripts/setup.sh --mpi NAME`, exit 2.

Skipped, saying so, when `scripts/setup.sh --mpi NAME` has not been run (`make test` runs it).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SBATCH, TEST_PORT, follow_job, preempt_after_step, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MPIS = {   # name -> (what results.json's versions.mpi starts with, the launch lines)
    "openmpi5": ("Open MPI v5.0.11", "mpirun -np {n} --map-by ppr:{ppn}:node", "srun --mpi=pmix"),
    "mpich": ("MPICH Version:", "mpiexec -n {n} -ppn {ppn}", "srun --mpi=pmi2"),
}


def need(name: str) -> Path:
    """The site directory of MPI ``name``; skip when its venv has not been set up."""
    venv, site = REPO / f".venv-{name}", REPO / "examples" / "sites" / name
    if not (venv / ".horovod-key").is_file():
        pytest.skip(f"{venv.name} has no Horovod: run scripts/setup.sh --mpi {name} "
                    "(make test does)")
    assert (site / "profile.yaml").is_file(), f"scripts/setup.sh --mpi {name} wrote no profile"
    return site


@pytest.mark.parametrize("name, package", [("openmpi5", "openmpi-5.0.11"),
                                           ("mpich", "mpich-5.0.2")])
def test_the_mpi_lives_in_a_prefix_under_the_cache_not_in_the_checkout(name, package):
    """setup_mpi.sh installs each MPI once into ~/.cache/hpcsuite/mpi/NAME-VERSION (its wheel keys
    hash that prefix, so another checkout reuses them): the venv links to it, holds no MPI of its
    own, and its Horovod and mpi4py load the prefix's libmpi."""
    import subprocess
    import sys

    need(name)
    venv = REPO / f".venv-{name}"
    prefix = (venv / "mpi").resolve()
    assert prefix.name == package and prefix.parent.name == "mpi", prefix
    assert REPO not in prefix.parents, prefix
    assert not (venv / "bin" / "mpicc").exists(), "the venv still holds the MPI's wheel"
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for lib in [*site.glob("horovod/torch/mpi_lib_v2*.so"), *site.glob("mpi4py/MPI*.so")]:
        ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, check=True).stdout
        [libmpi] = [words[2] for words in map(str.split, ldd.splitlines())
                    if words and words[0].startswith("libmpi.so")]
        assert Path(libmpi).resolve().parent == prefix / "lib", (lib, libmpi)
    profile = (REPO / "examples" / "sites" / name / "profile.yaml").read_text()
    assert f"export PATH={prefix}/bin:{venv}/bin:$PATH" in profile


@pytest.fixture(scope="module")
def mpi_cluster(wide_cluster, tmp_path_factory):
    """The session's wide cluster, two cores a node: a 2x2 job fits."""
    from conftest import cancel_all

    env = {k: v for k, v in os.environ.items() if k != "HPCSUITE_PROFILE"}
    env.update(SLURM_CONF=str(wide_cluster.conf), HPCSUITE_CLUSTER_DIR=str(wide_cluster.root),
               XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("mpis-xdg")))
    yield wide_cluster, env
    cancel_all(wide_cluster)


def site_env(env: dict, site: Path) -> dict:
    return dict(env, HPCSUITE_SITE_DIR=str(site))


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
@pytest.mark.parametrize("name", sorted(MPIS))
def test_the_quickstart_trains_with_each_mpi_under_each_launcher(mpi_cluster, tmp_path, name,
                                                                  launcher):
    site = need(name)
    _, env = mpi_cluster
    spec = (SBATCH / "quickstart.yaml").read_text().replace("launcher: mpirun",
                                                             f"launcher: {launcher}")
    (tmp_path / "quickstart.yaml").write_text(spec)
    proc = run_cli("submit", "quickstart.yaml", "--wait", cwd=tmp_path, env=site_env(env, site),
                   timeout=700)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next(d for d in (tmp_path / "runs" / "quickstart").iterdir() if d.is_dir())
    library, own, srun = MPIS[name]
    script = (run_dir / "job.sbatch").read_text()
    assert (own.format(n=2, ppn=1) if launcher == "mpirun" else srun) in script, script
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and sorted(results["hosts"]) == ["node1", "node2"]
    assert results["steps"] == 3 * 64
    assert results["versions"]["mpi"].startswith(library), results["versions"]
    sums = results["param_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]
    assert sum(results["loss"][-10:]) < 0.7 * sum(results["loss"][:10])


# Rank 1 sleeps in its forward pass, whichever launcher numbered it.
NET = """
import os
import time

from torch import nn

RANK = next((os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                     "SLURM_PROCID") if v in os.environ), "0")


class Slow(nn.Module):
    def __init__(self, shape, classes, delay):
        super().__init__()
        self.layer = nn.Linear(shape[0], classes)
        self.delay = delay if RANK == "1" else 0.0

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.layer(x)


def build(shape, classes, delay=0.0):
    return Slow(shape, classes, delay)
"""

TWO_BY_TWO = """name: twobytwo
launcher: {launcher}
resources: {{nodes: 2, tasks_per_node: 2, time: "00:05:00"}}
train:
  model: net.py:build
  model_args: {{delay: 0.004}}
  data: {{samples: 4096, shape: [32], classes: 4}}
  batch_size: 16
  epochs: 1000
  max_steps: 1200
  checkpoint: {{every_steps: 100000}}
  preemption: {{signal: USR1, requeue: true}}
"""


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
@pytest.mark.parametrize("name", sorted(MPIS))
def test_a_2x2_job_is_preempted_requeued_and_names_its_slow_rank(mpi_cluster, tmp_path, name,
                                                                  launcher):
    """Under the MPI's own launcher and under srun: the placement of two ranks per node, the
    warning signal reaching every rank, the save and Slurm's requeue, the resume, the slow
    rank."""
    site = need(name)
    cluster, env = mpi_cluster
    env = site_env(env, site)
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "job.yaml").write_text(TWO_BY_TWO.format(launcher=launcher))
    job_id = run_cli("submit", "job.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    run_dir = tmp_path / "runs" / "twobytwo" / job_id
    preempt_after_step(env, job_id, run_dir, step=50)
    state = follow_job(env, job_id, tmp_path, cluster)
    log = (tmp_path / "runs" / "twobytwo" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    _, own, srun = MPIS[name]
    assert (own.format(n=4, ppn=2) if launcher == "mpirun" else srun) in \
        (run_dir / "job.sbatch").read_text()

    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 4 and results["final_step"] == 1200, results.keys()
    assert sorted(results["hosts"]) == ["node1", "node1", "node2", "node2"]
    assert [a["status"] for a in results["attempts"]] == ["preempted", "completed"]
    cut = results["start_step"]
    assert 50 <= cut < 1200
    sums = results["param_checksums"]
    assert len(sums) == 4 and len(set(sums)) == 1
    slow = results["rank_balance"]["slow_rank"]
    assert slow and (slow["rank"], slow["host"]) == (1, "node1"), results["rank_balance"]
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank: rank 1 on node1" in status, status


def test_a_profile_whose_mpi_the_jobs_horovod_was_not_built_against_is_one_line(mpi_cluster,
                                                                             tmp_path):
    """The mpich profile with .venv's python, whose Horovod links Debian's Open MPI 4.1: under
    MPICH's mpiexec each rank would start alone as a world of one; it stops before hvd.init()."""
    site = need("mpich")
    _, env = mpi_cluster
    wrong = tmp_path / "site"
    wrong.mkdir()
    text = (site / "profile.yaml").read_text()
    ours = f"python: {REPO / '.venv-mpich' / 'bin' / 'python'}"
    assert ours in text, text
    theirs = f"python: {REPO / '.venv' / 'bin' / 'python'}"
    (wrong / "profile.yaml").write_text(text.replace(ours, theirs))
    (tmp_path / "quickstart.yaml").write_text((SBATCH / "quickstart.yaml").read_text())
    proc = run_cli("submit", "quickstart.yaml", "--wait", cwd=tmp_path, env=site_env(env, wrong),
                   timeout=400)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if "ended FAILED" in line]
    assert len(said) == 1, proc.stderr
    assert "ended FAILED: mpi.flavour: mpich (the site profile), but this rank's Horovod" in said[0]
    assert "links Open MPI v4.1" in said[0] and "scripts/setup.sh --mpi mpich" in said[0], said
    assert "Traceback" not in proc.stderr


CANCELLED = """name: cancelled
resources: {nodes: 2, tasks_per_node: 1, time: "00:05:00"}
train:
  data: {samples: 4096, shape: [32], classes: 4}
  batch_size: 16
  epochs: 1000
  max_steps: 30000
  checkpoint: {every_steps: 20}
  preemption: {signal: USR1, requeue: true, max_failures: 2}
"""


def test_a_cancel_under_open_mpi_5_stays_a_cancel(mpi_cluster, tmp_path):
    """Issue 51, point 7: prterun holds SIGTERM, the ranks save and exit 0; `scancel` is still
    a cancel: never requeued by hpcsuite, recorded as Slurm's stop with requeued: false."""
    import time

    site = need("openmpi5")
    cluster, env = mpi_cluster
    env = site_env(env, site)
    (tmp_path / "job.yaml").write_text(CANCELLED)
    job_id = run_cli("submit", "job.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    run_dir = tmp_path / "runs" / "cancelled" / job_id
    deadline = time.monotonic() + 180
    while not ((run_dir / "progress.json").is_file() and
               json.loads((run_dir / "progress.json").read_text() or "{}").get("step", 0) >= 30):
        assert time.monotonic() < deadline, "the job never reached step 30"
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], env=env, check=True)
    state = follow_job(env, job_id, tmp_path)
    log = (tmp_path / "runs" / "cancelled" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "CANCELLED", log[-3000:]
    assert "requeueing" not in log and "submit the same spec again" not in log, log[-3000:]
    records = [json.loads(l) for l in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert len(records) == 1, records
    assert (records[0]["signal"], records[0]["requeued"]) == ("TERM", False), records
    assert records[0]["outcome"] in ("preempted", "stopped"), records
    assert "from Slurm" in log and "Slurm decides" in log, log[-3000:]
