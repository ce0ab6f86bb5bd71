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

from ...errors import UserError

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
    # The node's local ranks would not each have their own: refused unless the spec says so
    # (lint refuses it at submit; this holds for a job.json written any other way, and for a
    # node where Slurm made fewer GPUs visible than the job asked for).
    short = (r.gpus_per_node and r.tasks_per_node * per_rank > r.gpus_per_node) or \
        (len(visible) > per_rank and (local_rank + 1) * per_rank > len(visible))
    if short and not r.gpu_sharing:
        raise UserError(f"resources.tasks_per_node: local rank {local_rank} would share a GPU "
                        f"({r.tasks_per_node} ranks per node, resources.gpus_per_node "
                        f"{r.gpus_per_node}, {VISIBLE}={','.join(visible)}); set "
                        "resources.gpu_sharing: true if sharing is meant")
    mine = choose(visible, local_rank, per_rank)
    env[VISIBLE] = ",".join(mine)
    if short:
        return (f"local rank {local_rank}: {VISIBLE}={env[VISIBLE]} (shared with other ranks of "
                "the node: resources.gpu_sharing)")
    if mine == visible:
        return f"local rank {local_rank}: {VISIBLE}={env[VISIBLE]} (as Slurm gave it)"
    return (f"local rank {local_rank}: {VISIBLE}={env[VISIBLE]} (its own of the node's "
            f"{','.join(visible)})")
