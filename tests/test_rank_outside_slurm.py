"""Nothing after training can lose its results: the version probes that stamp results.json
(``srun --version``, mpi4py's MPI library) run after the last step, so a rank where they fail
(Slurm's clients not on PATH: a lent GPU machine, a container image without them; no mpi4py
beside a Gloo-only Horovod) logs why and still writes results.json, exit 0."""

import os
import subprocess
import sys

from rank_by_hand import SLURM_CLIENTS, path_without, run_rank, write_job

from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results


def test_a_rank_without_slurms_clients_on_path_writes_its_results(tmp_path):
    run_dir = tmp_path / "runs" / "no-slurm" / "local"
    job = write_job(run_dir, {"name": "no-slurm", "output_dir": str(tmp_path / "runs"),
                              "train": {"max_steps": 6, "batch_size": 32,
                                        "data": {"samples": 512},
                                        "checkpoint": {"every_steps": 3}}})
    done = run_rank(job, env=dict(os.environ, PATH=path_without(SLURM_CLIENTS, tmp_path / "bin")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    results = Results.load(run_dir / "results.json")
    assert (results.status, results.final_step) == ("completed", 6)
    assert results.versions["slurm"] is None and results.versions["python"]
    assert "results.json without the Slurm version: srun: command not found" in \
        (run_dir / "logs" / "rank-0.log").read_text()
    assert [c["step"] for c in results.checkpoints] == [3, 6]


def test_a_failing_srun_leaves_the_slurm_version_out(monkeypatch):
    from hpcsuite import slurm
    from hpcsuite.runtime.train import slurm_version

    def missing(argv, **kw):
        raise UserError(f"{argv[0]}: command not found (is Slurm installed and on PATH?)")

    monkeypatch.setattr(slurm, "call", missing)
    assert slurm_version() is None
    monkeypatch.setattr(slurm, "call", lambda argv, **kw: slurm.Completed(argv, 1, "", "no"))
    assert slurm_version() is None
    monkeypatch.setattr(slurm, "call", lambda argv, **kw: slurm.Completed(argv, 0, "slurm 24.11\n", ""))
    assert slurm_version() == "slurm 24.11"


def test_no_libmpi_leaves_the_mpi_version_out(monkeypatch, caplog):
    from hpcsuite.runtime.frameworks import backend
    monkeypatch.setattr(backend.horovod_mpi, "loaded_libmpi", lambda: None)   # a Gloo-only Horovod
    assert backend.mpi_version() is None
    assert "results.json without the MPI version: this process loaded no libmpi" in caplog.text


def test_the_mpi_version_is_asked_of_the_loaded_libmpi_without_mpi4py():
    """Asked of the library the process loaded (here Debian's Open MPI, dlopened as Horovod's
    MPI library loads it), never through mpi4py: importing it after Horovod's shutdown aborted
    a rank under MPICH's srun --mpi=pmi2."""
    code = ("import ctypes, ctypes.util, sys\n"
            "ctypes.CDLL(ctypes.util.find_library('mpi'), mode=ctypes.RTLD_GLOBAL)\n"
            "from hpcsuite.runtime.frameworks.backend import mpi_version\n"
            "print(mpi_version()); print('mpi4py' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, imported = out.stdout.splitlines()
    assert version.startswith("Open MPI v4.1"), out
    assert imported == "False"
