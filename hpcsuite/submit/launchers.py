"""How ranks start inside an allocation: each launcher turns a job into an argv list.

Where a job runs (Slurm) is separate from how its ranks start (this module), as in ReFrame.
"""

from __future__ import annotations

from typing import ClassVar

from ..records import Record, record
from ..errors import UserError, close_match
from .site_profile import Mpi
from ..shell import Raw
from .spec import JobSpec


@record
class LaunchContext(Record):
    job: JobSpec
    mpi: Mpi                         # the site's MPI flavour and extra arguments
    command: tuple[object, ...]      # what every rank runs
    env_names: tuple[str, ...]       # variables every rank must see
    srun_options: tuple[object, ...] = ()   # srun options a container runtime needs (pyxis)


def binding(ctx: LaunchContext, key: str) -> str | None:
    """The job's CPU binding setting ``key``, else the site's (mpi.binding)."""
    return getattr(ctx.job.resources.binding, key) or getattr(ctx.mpi.binding, key)


class Launcher:
    name: ClassVar[str]

    def argv(self, ctx: LaunchContext) -> list[object]:
        raise NotImplementedError


class MpirunLauncher(Launcher):
    """OpenMPI's mpirun; under Slurm it starts its daemons with srun (no ssh)."""

    name = "mpirun"

    def argv(self, ctx: LaunchContext) -> list[object]:
        r = ctx.job.resources
        if ctx.srun_options:
            raise UserError("launcher: the site's container runtime needs srun; set launcher: srun")
        # Horovod's runner flags by default (mpi.binding): fill each node's slots in order
        # (under Slurm, a node's slots are its tasks per node), and no core binding: each rank
        # manages its own threads.
        argv: list[object] = ["mpirun", "-np", ctx.job.world_size, "-npernode", r.tasks_per_node,
                              "--map-by", binding(ctx, "map_by") or "slot",
                              "--bind-to", binding(ctx, "bind_to") or "none"]
        for key, value in ctx.mpi.mca.items():
            argv += ["--mca", key, value]
        for name in ctx.env_names:
            argv += ["-x", name]
        return argv + list(ctx.mpi.mpirun_args) + list(ctx.command)


class SrunLauncher(Launcher):
    """srun with PMIx: Slurm starts every rank itself."""

    name = "srun"

    def argv(self, ctx: LaunchContext) -> list[object]:
        r = ctx.job.resources
        cpu_bind = binding(ctx, "cpu_bind")
        gpu_bind = binding(ctx, "gpu_bind") if r.gpus_per_node or r.gpus_per_task else None
        return ["srun", f"--mpi={ctx.mpi.srun_mpi}", "--kill-on-bad-exit=1",
                f"--ntasks={ctx.job.world_size}", f"--ntasks-per-node={r.tasks_per_node}",
                f"--cpus-per-task={r.cpus_per_task}",
                *([f"--cpu-bind={cpu_bind}"] if cpu_bind else []),
                *([f"--gpu-bind={gpu_bind}"] if gpu_bind else []), *ctx.mpi.srun_args,
                *ctx.srun_options, *ctx.command]


LAUNCHERS: dict[str, type[Launcher]] = {cls.name: cls for cls in (MpirunLauncher, SrunLauncher)}


def get_launcher(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]()
    except KeyError:
        valid = ", ".join(sorted(LAUNCHERS))
        raise UserError(f"unknown launcher {name!r}{close_match(name, LAUNCHERS)}; "
                        f"valid launchers: {valid}") from None


__all__ = ["Launcher", "LaunchContext", "get_launcher", "LAUNCHERS", "Raw"]
