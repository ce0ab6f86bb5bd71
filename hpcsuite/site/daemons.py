"""The local cluster's daemons as processes: what each runs, and whether a recorded pid still
runs it (:class:`~.cluster.LocalCluster` starts and stops them)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Daemon:
    name: str          # munged, slurmctld, slurmd-node1, ...
    argv: tuple[str, ...]
    program: str       # what /proc/<pid>/comm must show
    cpus: tuple[int, ...] = ()   # cores it and everything it starts may use (() = all)


def affinity(pid: int | None) -> set[int] | None:
    try:
        return os.sched_getaffinity(pid) if pid else None
    except OSError:
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def is_ours(pid: int, program: str, root: str) -> bool:
    """The pid still runs ``program`` with our cluster directory on its command line or in
    its environment (SLURM_CONF: slurmdbd takes no path arguments)."""
    if not alive(pid):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if comm == program and root not in cmdline:
            cmdline = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return comm == program and root in cmdline


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def which(prog: str) -> bool:
    from shutil import which
    return which(prog) is not None


def closed_to_others(path: Path) -> Path | None:
    """The first directory from / down to ``path`` that other accounts cannot enter."""
    for d in [*reversed(path.parents), path]:
        try:
            if not d.stat().st_mode & 0o001:
                return d
        except OSError:
            return d
    return None


def end_jobs(env: dict, wait: float = 15.0) -> int:
    """Cancel every job the cluster behind ``env`` (its SLURM_CONF) still has, and wait up to
    ``wait`` seconds for them to leave: stopping the daemons under a running job would leave
    its slurmstepd and ranks running with no slurmd to end them (and, on a fabric, keep the
    node's network namespace alive). How many jobs there were (0 when Slurm cannot be
    asked)."""
    import time

    from .. import slurm

    def jobs() -> list[str]:
        done = slurm.call(["squeue", "-h", "-o", "%i"], env=env, timeout=10, check=False)
        return done.stdout.split() if done.returncode == 0 else []

    found = jobs()
    if found:
        slurm.call(["scancel", *found], env=env, timeout=10, check=False)
        deadline = time.monotonic() + wait
        while jobs() and time.monotonic() < deadline:
            time.sleep(0.5)
    return len(found)


def failure_line(log_dir: Path, name: str) -> str:
    """The most telling line of daemon ``name``'s logs in ``log_dir`` (its captured output and
    its own log): the last fatal or error line, else the last line."""
    candidates = [log_dir / f"{name}.out", log_dir / f"{name}.log"]
    lines: list[str] = []
    for path in candidates:
        try:
            lines += path.read_text(errors="replace").splitlines()[-50:]
        except OSError:
            pass
    bad = [l for l in lines if any(w in l.lower() for w in ("fatal", "error"))]
    pick = (bad or lines or ["no log output"])[-1].strip()
    return f"{pick} (logs in {log_dir})"
