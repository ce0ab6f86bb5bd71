"""How ranks start inside an allocation: each launcher turns a job into an argv list.

Where a job runs (Slurm) is separate from how its ranks start (this module), as in ReFrame.
"""

from __future__ import annotations

from typing import ClassVar

from ..records import Record, record
from ..errors import UserError, close_match
from .mpi_flavours import binding, flavour
from .site_profile import Mpi
from ..shell import Raw
from .spec import JobSpec


@record
class LaunchContext(Record):
    """What a launcher needs to write the line that starts every rank."""
    job: JobSpec
    mpi: Mpi                         # the site's MPI flavour and extra arguments
    command: tuple[object, ...]      # what every rank runs
    env_names: tuple[str, ...]       # variables every rank must see
    srun_options: tuple[object, ...] = ()   # srun options a container runtime needs (pyxis)
    python: str = "python3"                 # the site's interpreter on the nodes (hpcsuite's own helpers)


class Launcher:
    name: ClassVar[str]

    def argv(self, ctx: LaunchContext) -> list[object]:
        raise NotImplementedError


class MpirunLauncher(Launcher):
    """The MPI's own launcher (:mod:`hpcsuite.submit.mpi_flavours`): Open MPI's mpirun, the
    Hydra mpiexec of MPICH and Intel MPI; under Slurm each starts its daemons with srun (no
    ssh)."""

    name = "mpirun"

    def argv(self, ctx: LaunchContext) -> list[object]:
        own = flavour(ctx.mpi.flavour)
        if ctx.srun_options:
            raise UserError("launcher: the site's container runtime needs srun; set launcher: srun")
        return own.mpirun(ctx) + list(ctx.mpi.mpirun_args) + list(ctx.command)


class SrunLauncher(Launcher):
    """srun with PMIx: Slurm starts every rank itself."""

    name = "srun"

    def argv(self, ctx: LaunchContext) -> list[object]:
        r = ctx.job.resources
        cpu_bind = binding(ctx, "cpu_bind")
        gpu_bind = binding(ctx, "gpu_bind") if r.gpus_per_node or r.gpus_per_task else None
        return ["srun", f"--mpi={ctx.mpi.srun_plugin()}", "--kill-on-bad-exit=1",
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
