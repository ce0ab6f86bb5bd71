"""Rank, world size and local rank from the launcher's environment, before Horovod starts."""

from __future__ import annotations

import os
from dataclasses import dataclass

_SOURCES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    size: int
    local_rank: int


def from_env(env=os.environ) -> RankInfo:
    for rank, size, local in _SOURCES:
        if rank in env and size in env:
            return RankInfo(int(env[rank]), int(env[size]), int(env.get(local, "0")))
    return RankInfo(0, 1, 0)
