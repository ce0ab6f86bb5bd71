"""The world a process of a job runs in, read once from its environment into one frozen record.

Who started it decides which variables say what: Open MPI's mpirun (``OMPI_COMM_WORLD_*``, 4.x
and 5.x), the Hydra mpiexec of MPICH and Intel MPI (``PMI_RANK``/``PMI_SIZE``,
``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``), srun with PMIx (``PMIX_RANK``) or PMI-2
(``PMI_RANK``), or srun alone (``SLURM_PROCID``...). Under mpirun and mpiexec the launcher's
daemons are themselves started by srun, so the SLURM_* task variables describe a daemon (one per
node), not the rank: the launcher's own variables come first. Slurm's job id, cluster and node
name (``SLURMD_NODENAME``, which on nodes that share a host differs from the host name) come
from Slurm whoever started the ranks.

An entry point reads it once (:func:`current`) and hands it on; tests build it from a dict
(:func:`from_env`). Like submitit's ``JobEnvironment``. A leaf: the batch shell's commands
(runs/attempts.py) and the ranks (runtime/) read the same record.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: str = ""                    # the Slurm node (SLURMD_NODENAME), else the host name
    host: str = ""                    # the machine's host name
    job_id: str | None = None         # SLURM_JOB_ID
    cluster: str | None = None        # SLURM_CLUSTER_NAME: job ids repeat across clusters
    array_job_id: str | None = None   # SLURM_ARRAY_JOB_ID, in an element of a job array
    array_task_id: str | None = None  # SLURM_ARRAY_TASK_ID
    attempt: int = 0                  # how often Slurm requeued the job (SLURM_RESTART_COUNT)
    started_by: str = "none"          # openmpi, hydra, pmix, pmi2, slurm or none (one process)
    nodes: tuple[str, ...] = ()       # the job's nodes in Slurm's order (SLURM_JOB_NODELIST)


def _int(env, name: str, default: int | None = None) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return default


def tasks_on_node(spec: str, node_index: int) -> int | None:
    """The tasks of node ``node_index`` in Slurm's per-node count (``2(x3),1``), or None."""
    counts: list[int] = []
    for part in spec.split(","):
        count, _, repeat = part.partition("(x")
        try:
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
        except ValueError:
            return None
    return counts[node_index] if 0 <= node_index < len(counts) else None


def _slurm_local_size(env) -> int | None:
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    return tasks_on_node(spec, _int(env, "SLURM_NODEID", 0)) if spec else None


def _ranks(env) -> tuple[str, int, int, int | None, int | None]:
    """(started_by, rank, size, local rank, local size) from the first launcher that set them."""
    slurm_size = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS")
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        return ("openmpi", _int(env, "OMPI_COMM_WORLD_RANK", 0), _int(env, "OMPI_COMM_WORLD_SIZE", 1),
                _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
    if "MPI_LOCALRANKID" in env and "PMI_RANK" in env:   # Hydra's proxy (MPICH, Intel MPI)
        return ("hydra", _int(env, "PMI_RANK", 0), _int(env, "PMI_SIZE", 1),
                _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS"))
    if "PMIX_RANK" in env and slurm_size:                # srun --mpi=pmix
        return ("pmix", _int(env, "PMIX_RANK", 0), slurm_size, _int(env, "SLURM_LOCALID"),
                _slurm_local_size(env))
    if "PMI_RANK" in env and "PMI_SIZE" in env:          # srun --mpi=pmi2
        return ("pmi2", _int(env, "PMI_RANK", 0), _int(env, "PMI_SIZE", 1),
                _int(env, "SLURM_LOCALID"), _slurm_local_size(env))
    if "SLURM_PROCID" in env and slurm_size:             # srun without PMI
        return ("slurm", _int(env, "SLURM_PROCID", 0), slurm_size, _int(env, "SLURM_LOCALID"),
                _slurm_local_size(env))
    return "none", 0, 1, 0, 1


def from_env(env=os.environ, hostname: str | None = None) -> World:
    """The world that ``env`` describes (``hostname``: the machine's, looked up if not given)."""
    started_by, rank, size, local_rank, local_size = _ranks(env)
    host = hostname if hostname is not None else socket.gethostname()
    return World(rank=rank, size=size, local_rank=local_rank or 0,
                 local_size=local_size or 1, node=env.get("SLURMD_NODENAME") or host, host=host,
                 job_id=env.get("SLURM_JOB_ID") or None,
                 cluster=env.get("SLURM_CLUSTER_NAME") or None,
                 array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
                 array_task_id=env.get("SLURM_ARRAY_TASK_ID") or None,
                 attempt=_int(env, "SLURM_RESTART_COUNT", 0) or 0, started_by=started_by,
                 nodes=tuple(expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get(
                     "SLURM_NODELIST") or "")))


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded in its order: ``node[1-3,7],gpu[01-02]`` is
    node1, node2, node3, node7, gpu01, gpu02; several bracketed ranges in one name multiply
    (``r[1-2]n[1-2]``: r1n1, r1n2, r2n1, r2n2); a range keeps its zero padding. [] for text
    that is not one (the caller then has no node list, as outside Slurm). Written here, not
    taken from python-hostlist: that is GPL-2.0 and only an sdist, for twenty lines."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            return []
        if ch == "," and depth == 0:
            item, start = text[start:i].strip(), i + 1
            expanded = _expand_one(item) if item else []
            if expanded is None:
                return []
            names += expanded
    return names if depth == 0 else []


def _expand_one(item: str) -> list[str] | None:
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    ranges, close, tail = rest.partition("]")
    tails = _expand_one(tail) if close else None
    if tails is None:
        return None
    out = []
    for part in ranges.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            return None
        for n in range(int(low), int(high if dash else low) + 1):
            out += [f"{head}{n:0{len(low)}d}{t}" for t in tails]
    return out


def current() -> World:
    """This process's world. An entry point reads it once and hands it on; helpers far from
    one (a monitor's label, a results file's job id) ask here rather than read Slurm's or the
    launcher's variables themselves. Not cached: tests change the environment in-process."""
    return from_env()
