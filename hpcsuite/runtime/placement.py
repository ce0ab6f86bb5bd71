"""Which GPU a rank uses, settled before a framework is imported.

Slurm makes a node's granted GPUs visible to a task through ``CUDA_VISIBLE_DEVICES``. Under
srun with ``gpus_per_task`` or ``--gpu-bind=single:1`` each rank sees only its own; under
mpirun (one daemon per node, started by srun) and under srun with ``gpus_per_node`` alone,
every rank of a node sees all of them. Then rank ``L`` of the node (its local rank) takes the
L-th of them, and only that one stays visible: CUDA, NCCL and the framework see one device,
``cuda:0``, and no two ranks of a node share a GPU by accident. Horovod's own advice (pin by
local rank) is the same choice, made here once for both backends and for script mode.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_devices(env=os.environ) -> list[str]:
    """The devices Slurm made visible (``NoDevFiles``: none; unset: no GPU was granted)."""
    text = env.get(VISIBLE, "").strip()
    if not text or text == "NoDevFiles":
        return []
    return [d.strip() for d in text.split(",") if d.strip()]


def choose(visible: list[str], local_rank: int, gpus_per_rank: int) -> list[str]:
    """The devices local rank ``local_rank`` keeps: its own ``gpus_per_rank`` of ``visible``
    (all of them when Slurm already gave this rank only its own)."""
    if len(visible) <= gpus_per_rank:
        return visible
    start = (local_rank * gpus_per_rank) % len(visible)
    return visible[start:start + gpus_per_rank]


def place(job, local_rank: int, env=os.environ) -> str | None:
    """Narrow ``CUDA_VISIBLE_DEVICES`` in ``env`` to this rank's GPUs when the job asked for
    GPUs; a line saying what this rank sees (None when the job asked for none)."""
    r = job.resources
    if not (r.gpus_per_node or r.gpus_per_task):
        return None
    visible = visible_devices(env)
    if not visible:
        return f"local rank {local_rank}: Slurm made no GPU visible ({VISIBLE} unset)"
    per_rank = r.gpus_per_task or max(1, r.gpus_per_node // max(1, r.tasks_per_node))
    mine = choose(visible, local_rank, per_rank)
    env[VISIBLE] = ",".join(mine)
    if mine == visible:
        return f"local rank {local_rank}: {VISIBLE}={env[VISIBLE]} (as Slurm gave it)"
    return (f"local rank {local_rank}: {VISIBLE}={env[VISIBLE]} (its own of the node's "
            f"{','.join(visible)})")
