"""End to end: each MPI's own launch line as hpcsuite renders it (mpi.flavour openmpi5, intelmpi,
mpich) on the local Slurm cluster, without Horovod: under `launcher: mpirun` (Open MPI 5's
`mpirun -np 2 --map-by ppr:1:node`, with each node's own shared-memory directory through
btl_sm_backing_directory and PRRTE's kill timeout; Hydra's `mpiexec -n 2 -ppn 1 -genvlist ...`,
Intel MPI's ranks unpinned with I_MPI_PIN=0) and under `launcher: srun` for the Hydra MPIs
(`--mpi=pmi2`, the flavour's plugin; Intel MPI 2021 needs no I_MPI_PMI_LIBRARY for it). A rank
on each node reads its world from the launcher's variables (hpcsuite/world.py) and the two
allreduce through the MPI's own libmpi (ctypes). Horovod against Open MPI 5 and MPICH is
tests/test_e2e_mpis.py's. Intel MPI is PyPI's impi-rt (scripts/intelmpi.sh), MPICH and Open MPI 5
PyPI's, in the prefix .venv-mpich/mpi and .venv-openmpi5/mpi link to (scripts/setup.sh --mpi
NAME); a missing one is skipped, saying so."""

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOMES = {   # flavour -> where its runtime is, how to make it, what its library says it is
    "intelmpi": (Path(os.environ.get("HPCSUITE_IMPI_DIR") or
                      Path.home() / ".cache" / "hpcsuite" / "impi-rt"),
                 "scripts/intelmpi.sh", "Intel(R) MPI Library"),
    "mpich": (REPO / ".venv-mpich" / "mpi", "scripts/setup.sh --mpi mpich", "MPICH Version:"),
    "openmpi5": (REPO / ".venv-openmpi5" / "mpi", "scripts/setup.sh --mpi openmpi5", "Open MPI v5"),
}
LIBMPI = {"openmpi5": "libmpi.so.40", "intelmpi": "libmpi.so.12", "mpich": "libmpi.so.12"}

# MPICH's ABI (Intel MPI's too): handles are ints (MPI_COMM_WORLD, MPI_INT, MPI_SUM); Open
# MPI's are the addresses of its predefined objects.
SCRIPT = """\
import ctypes, json, os
from hpcsuite.world import current

world = current()
mpi = ctypes.CDLL(os.environ["TEST_LIBMPI"], mode=ctypes.RTLD_GLOBAL)
if os.environ["TEST_LIBMPI"] == "libmpi.so.40":
    handle = lambda name: ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(mpi, name)))
    comm, mpi_int, mpi_sum = (handle(f"ompi_mpi_{n}") for n in ("comm_world", "int", "op_sum"))
else:
    comm, mpi_int, mpi_sum = 0x44000000, 0x4c000405, 0x58000003
mpi.MPI_Init(None, None)
size, total = ctypes.c_int(), ctypes.c_int()
mpi.MPI_Comm_size(comm, ctypes.byref(size))
mine = ctypes.c_int(world.rank + 1)
mpi.MPI_Allreduce(ctypes.byref(mine), ctypes.byref(total), 1, mpi_int, mpi_sum, comm)
version = ctypes.create_string_buffer(8192)
mpi.MPI_Get_library_version(version, ctypes.byref(ctypes.c_int()))
mpi.MPI_Finalize()
with open(os.path.join(os.environ["HPCSUITE_RUN_DIR"], f"world-{world.rank}.json"), "w") as f:
    json.dump({"world": world.__dict__, "mpi_size": size.value, "sum": total.value,
               "library": version.value.decode().split(",")[0],
               "I_MPI_PIN": os.environ.get("I_MPI_PIN"),
               "shm": os.environ.get("OMPI_MCA_btl_sm_backing_directory"),
               "kill": os.environ.get("PRTE_MCA_odls_base_sigkill_timeout")}, f)
"""


@pytest.mark.parametrize("flavour, launcher", [("openmpi5", "mpirun"), ("intelmpi", "mpirun"),
                                               ("intelmpi", "srun"), ("mpich", "mpirun"),
                                               ("mpich", "srun")])
def test_a_rank_on_each_node_allreduces_under_the_mpis_launcher(local_cluster, tmp_path,
                                                                flavour, launcher):
    home, how, library = HOMES[flavour]
    if not (home / "bin" / "mpiexec").is_file():
        pytest.skip(f"no {flavour} runtime in {home}: run {how}")
    _, env = local_cluster
    (tmp_path / "allreduce.py").write_text(SCRIPT)
    (tmp_path / "profile.yaml").write_text(
        f"python: {sys.executable}\npartitions: {{debug: {{}}}}\n"
        f"defaults: {{resources: {{partition: debug}}}}\n"
        f"mpi: {{flavour: {flavour}, nodes_share_host: true}}\n"
        f"setup: ['export PATH={home}/bin:$PATH', 'export LD_LIBRARY_PATH={home}/lib', "
        f"'export TEST_LIBMPI={LIBMPI[flavour]}']\n")
    (tmp_path / "job.yaml").write_text(
        f"name: hydra\nlauncher: {launcher}\nresources: {{nodes: 2, tasks_per_node: 1, "
        "time: '00:05:00'}\ntrain: {script: allreduce.py}\n")
    proc = run_cli("submit", "job.yaml", "--profile", "profile.yaml", "--wait", "--timeout", "200",
                   cwd=tmp_path, env=env, timeout=260)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next(p for p in (tmp_path / "runs" / "hydra").iterdir() if p.is_dir())
    line = {"mpirun": "\nmpiexec -n 2 -ppn 1 " + ("" if flavour == "intelmpi" else "-bind-to none ")
            + "-genvlist PATH,HPCSUITE_RUN_DIR,", "srun": "\nsrun --mpi=pmi2 "}[launcher]
    if flavour == "openmpi5":
        held = f"{sys.executable} -m hpcsuite.runtime.hold_term"   # PRRTE's daemons hold SIGTERM
        line = (f"\n{held} mpirun -np 2 --map-by ppr:1:node --bind-to none --prtemca "
                f"prte_launch_agent '{held} prted' --mca pml ob1 --mca btl ")
    assert line in (run_dir / "job.sbatch").read_text()
    ranks = [json.loads((run_dir / f"world-{r}.json").read_text()) for r in (0, 1)]
    for rank, said in enumerate(ranks):
        world = said["world"]
        assert (world["rank"], world["size"], world["local_rank"], world["local_size"]) == \
            (rank, 2, 0, 1), said
        assert world["node"] == f"node{rank + 1}", said
        assert world["started_by"] == ("openmpi" if flavour == "openmpi5" else
                                       {"mpirun": "hydra", "srun": "pmi2"}[launcher]), said
        assert said["mpi_size"] == 2 and said["sum"] == 3, said      # 1 + 2 over the MPI
        assert said["library"].startswith(library), said
        assert said["I_MPI_PIN"] == ("0" if flavour == "intelmpi" else None)
        # nodes that share this host: Open MPI 5's segments in a directory of each node's own
        own = f"/dev/shm/hpcsuite-{os.getuid()}-{world['job_id']}-node{rank + 1}"
        assert said["shm"] == (own if flavour == "openmpi5" else None), said
        assert said["kill"] is None, said   # PRRTE 3.0 reads no kill timeout (hold_term instead)
    [attempt] = [json.loads(l) for l in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert attempt["outcome"] == "completed" and attempt["host"] == "node1"
