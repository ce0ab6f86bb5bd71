"""One rank of `hpcsuite train` started by hand, outside Slurm: the resolved job.json the batch
script would write, and `python -m hpcsuite train --job JOB` in a subprocess with the
environment a rank has there (no SLURM_*, no launcher variables), as on a lent GPU machine or
in a container image without Slurm's clients. Used by tests/test_rank_outside_slurm.py and
tests/test_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Slurm's client programs: a rank outside Slurm may have none of them.
SLURM_CLIENTS = ("srun", "sbatch", "salloc", "sacct", "scontrol", "squeue", "sinfo", "scancel",
                 "sstat", "sattach", "sprio", "sshare", "sreport", "sacctmgr", "sdiag")


def write_job(run_dir: Path, spec: dict) -> Path:
    """``run_dir``/job.json: ``spec`` resolved as `hpcsuite submit` resolves it."""
    from hpcsuite.submit.spec import spec_from_dict

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.json"
    path.write_text(json.dumps(spec_from_dict(spec, "test").to_dict(), sort_keys=True))
    return path


def path_without(programs: tuple[str, ...], shadow: Path) -> str:
    """A PATH that finds every program this one finds except ``programs``: ``shadow`` holds a
    link to each (the first directory's wins, as in PATH)."""
    shadow.mkdir(parents=True, exist_ok=True)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d or not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = shadow / entry.name
            if entry.name in programs or link.exists() or link.is_symlink():
                continue
            if os.access(entry.path, os.X_OK) and not entry.is_dir():
                link.symlink_to(entry.path)
    return str(shadow)


def run_rank(job: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m hpcsuite train --job JOB` as the only rank, outside Slurm and any launcher;
    the run directory is the job file's."""
    env = {k: v for k, v in (os.environ if env is None else env).items()
           if not k.startswith(("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_"))}
    env["HPCSUITE_RUN_DIR"] = str(job.parent)
    return subprocess.run([sys.executable, "-m", "hpcsuite", "train", "--job", str(job)],
                          cwd=job.parent, env=env, capture_output=True, text=True, timeout=timeout)
