"""Open MPI's shared memory on Slurm nodes that share one host.

Open MPI's shared-memory transport (the vader BTL) names each rank's segment
``vader_segment.HOST.JOBID.LOCALRANK`` in ``/dev/shm``. Several slurmd on one machine (the
local cluster's node1 and node2, ``hpcsuite cluster up``) are one HOST to it, so local rank 0 of
node1 and local rank 0 of node2 open the same segment: with two or more ranks per node the
ranks crash in ``mca_btl_vader_poll_handle_frag`` or wait forever inside Horovod's init. A
site profile that says its nodes share a host (``mpi.nodes_share_host``) makes the batch
script export ``HPCSUITE_NODE_PRIVATE_SHM``; each rank then gives its node its own directory before MPI starts,
and shared memory stays the transport between a node's ranks. Real clusters (one slurmd per
host) never set it and keep Open MPI's default.
"""

from __future__ import annotations

import atexit
import os
import re
from pathlib import Path

from ...runs.rundir import NODE_PRIVATE_SHM as ENV   # the base directory, from the batch script
from ...runs.rundir import NODE_SHM_VARIABLE
from ...world import from_env

BACKING = "OMPI_MCA_btl_vader_backing_directory"   # Open MPI 4's; the batch script names another


def backing(env=os.environ) -> str:
    """The MPI's variable for its shared-memory directory (Open MPI 5: btl_sm_...)."""
    return env.get(NODE_SHM_VARIABLE) or BACKING


def node_directory(base: str, env=os.environ) -> Path:
    """This job's directory for this node's segments: BASE/hpcsuite-UID-JOB-NODE."""
    world = from_env(env)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_",
                  f"hpcsuite-{os.getuid()}-{world.job_id or 'nojob'}-{world.node}")
    return Path(base) / name


def private_shm(env=os.environ) -> str | None:
    """Point Open MPI's shared-memory segments at a directory of this node's own when the
    batch script asked for it and nobody chose a backing directory; a line saying so."""
    base, variable = env.get(ENV), backing(env)
    if not base or env.get(variable):
        return None
    path = node_directory(base, env)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    env[variable] = str(path)
    # registered before Horovod is imported, so it runs after Horovod's own exit handler
    # has shut MPI down and the segments are gone
    atexit.register(remove_private_shm, env)
    return f"Open MPI shared memory of this node in {path} (nodes share this host)"


def remove_private_shm(env=os.environ) -> None:
    """Remove this node's directory once it is empty (the last rank of the node to leave)."""
    base, variable = env.get(ENV), backing(env)
    if not base or env.get(variable) != str(node_directory(base, env)):
        return
    try:
        os.rmdir(env[variable])
    except OSError:
        pass   # another rank of this node still holds a segment, or it is gone already
