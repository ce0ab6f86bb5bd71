"""Everything that differs between MPI libraries, chosen by the site profile's ``mpi.flavour``.

A flavour owns how its own launcher starts the ranks (``launcher: mpirun`` means "the MPI's own
launcher": Open MPI's mpirun, the Hydra ``mpiexec`` of MPICH and Intel MPI), how the job's
environment reaches them, how they are bound to cores, the srun ``--mpi`` plugin it works with,
and the settings its ranks need (busy-poll yield, the kill timeout, the shared-memory directory
of nodes that share a host). The knowledge comes from Horovod's runner (``mpi_run.py``): map by
slot, bind to nothing, ob1 without openib for Open MPI; ``-bind-to none`` for Hydra. Who each
flavour is (its libraries and versions, its launcher, its srun plugin) is its record in
:data:`hpcsuite.mpis.FLAVOURS`, which doctor and the rank's check read too.
"""

from __future__ import annotations

from typing import ClassVar

from .. import mpis
from ..runs import rundir

RANK_STOP_SECONDS = 10   # a rank's time to save after Slurm's SIGTERM (KillWait bounds it)
# Horovod's runner's with Open MPI: ob1 over TCP and shared memory, and no openib BTL, which
# warns and can hang with fork() (Open MPI 5 has none: excluding it is harmless).
DEFAULT_MCA = {"pml": "ob1", "btl": "^openib"}


def binding(ctx, key: str) -> str | None:
    """The job's CPU binding setting ``key``, else the site's (mpi.binding)."""
    return getattr(ctx.job.resources.binding, key) or getattr(ctx.mpi.binding, key)


def _bindings(job, mpi, keys):
    """(key, value, where it is set) of the binding settings ``keys`` that are set."""
    for key in keys:
        if getattr(job.resources.binding, key):
            yield key, getattr(job.resources.binding, key), f"resources.binding.{key}"
        elif getattr(mpi.binding, key):
            yield key, getattr(mpi.binding, key), f"mpi.binding.{key}"


class Flavour:
    """Open MPI 4.x, the default: ``mpirun -np N -npernode M --map-by --bind-to -x NAME``."""

    record: ClassVar[mpis.MpiFlavour] = mpis.FLAVOURS["openmpi"]
    # Open MPI's shared-memory directory variable (runtime/rank/shm.py sets it per node)
    shm_backing: ClassVar[str | None] = "OMPI_MCA_btl_vader_backing_directory"

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def srun_mpi(self) -> str:
        """srun's --mpi plugin unless the profile says."""
        return self.record.srun_mpi

    def mpirun(self, ctx) -> list[object]:
        """Horovod's runner flags by default (mpi.binding): fill each node's slots in order
        (under Slurm a node's slots are its tasks per node), no core binding: each rank
        manages its own threads."""
        r = ctx.job.resources
        argv: list[object] = [self.record.launcher, "-np", ctx.job.world_size,
                              "-npernode", r.tasks_per_node,
                              "--map-by", binding(ctx, "map_by") or "slot",
                              "--bind-to", binding(ctx, "bind_to") or "none"]
        return argv + self.mca_args(ctx.mpi) + self.env_args(ctx.env_names)

    def mca_args(self, mpi) -> list[object]:
        return [word for key, value in mpi.mca.items() for word in ("--mca", key, value)]

    def launcher_signals(self, preemption_signal: str) -> dict[str, str] | None:
        """The signals the batch shell sends its launcher where SIGTERM would not do: ``stop``
        in place of a TERM it forwards (the ranks take it as "save and stop" too), ``end`` to
        end it after a rank failed. None: TERM for both (ORTE's mpirun forwards a TERM to its
        ranks and gives them odls_base_sigkill_timeout; Hydra and srun forward it)."""
        return None

    def env_args(self, names) -> list[object]:
        return [word for name in names for word in ("-x", name)]

    def environment(self, job, mpi) -> dict[str, str]:
        """What the ranks need beyond the site's MCA parameters.

        A rank given one core shares it with Horovod's background thread, which makes the MPI
        calls. Open MPI busy-polls while it waits unless it knows a node is oversubscribed, and
        it cannot know this one is: the polling thread then holds the core the rank computes on
        (on the local cluster single 2-rank runs swung 10x). Such ranks yield while they wait;
        a site decides otherwise with ``mpi.mca.mpi_yield_when_idle``.

        When Slurm ends a job itself (``scontrol requeue``, a preemption without the warning
        signal, a cancel) its SIGTERM reaches mpirun and every rank at once; mpirun exits, and
        each node's daemon ends its ranks with a SIGKILL after its own SIGTERM, 1 s by default:
        too soon for the ranks to agree and save (seen: 1 requeue in 8 lost its save). The ranks
        are given :data:`RANK_STOP_SECONDS`, as srun gives them Slurm's KillWait; a site sets
        the kill timeout itself for larger checkpoints."""
        env = {}
        if job.resources.cpus_per_task < 2 and "mpi_yield_when_idle" not in mpi.mca:
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        env.update(self.kill_timeout(mpi))
        if mpi.nodes_share_host:   # each node's ranks their own segments (runtime/rank/shm.py)
            env[rundir.NODE_PRIVATE_SHM] = "/dev/shm"
            if self.shm_backing != Flavour.shm_backing:
                env[rundir.NODE_SHM_VARIABLE] = self.shm_backing
        return env

    def kill_timeout(self, mpi) -> dict[str, str]:
        """ORTE's daemon (orted) reads ``odls_base_sigkill_timeout``."""
        if "odls_base_sigkill_timeout" in mpi.mca:
            return {}
        return {"OMPI_MCA_odls_base_sigkill_timeout": str(RANK_STOP_SECONDS)}

    def problems(self, job, profile) -> list[tuple[str, str]]:
        """(key, why) for what this MPI cannot use of the site profile or the job (lint warns)."""
        return []


class OpenMpi5(Flavour):
    """Open MPI 5.x: PRRTE's mpirun places with ``--map-by ppr:M:node`` (``-npernode`` is
    deprecated), its shared-memory BTL is ``sm`` (``vader`` is a deprecated alias), and its
    daemons are PRRTE's, which abort on a SIGTERM (:meth:`hold_term`)."""

    record = mpis.FLAVOURS["openmpi5"]
    shm_backing = "OMPI_MCA_btl_sm_backing_directory"

    def mpirun(self, ctx) -> list[object]:
        r = ctx.job.resources
        map_by = binding(ctx, "map_by") or "slot"
        place, _, modifiers = map_by.partition(":")
        if place == "slot":   # a node's slots in order: ppr keeps -npernode's meaning
            map_by = f"ppr:{r.tasks_per_node}:node" + (f":{modifiers}" if modifiers else "")
        argv: list[object] = [*self.hold_term(ctx.python), self.record.launcher,
                              "-np", ctx.job.world_size,
                              "--map-by", map_by, "--bind-to", binding(ctx, "bind_to") or "none"]
        if "prte_launch_agent" not in ctx.mpi.mca and "prte_launch_agent" not in ctx.mpi.mpirun_args:
            argv += ["--prtemca", "prte_launch_agent", " ".join([*self.hold_term(ctx.python), "prted"])]
        return argv + self.mca_args(ctx.mpi) + self.env_args(ctx.env_names)

    @staticmethod
    def hold_term(python: str) -> list[str]:
        """PRRTE's daemons, prterun (mpirun) and prted, abort the job on a SIGTERM: they end
        their ranks with a SIGKILL half a second later (PRRTE 3.0 has no kill timeout to set),
        before a save, and Slurm's own stop of a job (``scontrol requeue``, a cancel) sends
        SIGTERM to every process at once. So both start with SIGTERM blocked
        (:mod:`hpcsuite.runtime.hold_term`; prterun starts each node's prted through srun with
        its launch agent): Slurm's TERM reaches the ranks alone, they save and exit, and the
        daemons end with them, as ORTE's did in 4.x."""
        return [python, "-m", "hpcsuite.runtime.hold_term"]

    def launcher_signals(self, preemption_signal: str) -> dict[str, str] | None:
        """prterun holds SIGTERM (:meth:`hold_term`): a stop the batch shell forwards goes as
        the job's preemption signal, which PRRTE forwards to the ranks; SIGINT ends it."""
        return {"stop": preemption_signal, "end": "INT"}

    def environment(self, job, mpi) -> dict[str, str]:
        """Nodes that share a host also share its addresses, and Open MPI 5's netlink
        reachability (Debian 13's 5.0.7) then pairs no interface of node1 with node2's: "Unable
        to find reachable pairing between local and remote interfaces", the job aborts. Its
        weighted component pairs them (what 4.1 did here); a site's own choice stands."""
        env = super().environment(job, mpi)
        if mpi.nodes_share_host and "reachable" not in mpi.mca:
            env["OMPI_MCA_reachable"] = "weighted"
        return env

    def kill_timeout(self, mpi) -> dict[str, str]:
        """None to set: PRRTE 3.0 (Open MPI 5.0's) reads no odls_base_sigkill_timeout, its odls
        sends SIGKILL 0.5 s after SIGTERM; its daemons hold Slurm's SIGTERM instead."""
        return {}

    def problems(self, job, profile) -> list[tuple[str, str]]:
        out = []
        for key, value in profile.mpi.mca.items():
            if "vader" in key or "vader" in value.split(","):
                out.append((f"mpi.mca.{key}", "Open MPI 5 names the shared-memory BTL sm, not "
                            "vader (a deprecated alias)"))
        return out


class Mpich(Flavour):
    """MPICH's Hydra: ``mpiexec -n N -ppn M -bind-to none -genvlist A,B``. Under Slurm Hydra
    starts its proxies with srun and reads the nodes from the allocation."""

    record = mpis.FLAVOURS["mpich"]
    shm_backing = None   # MPICH names its segments uniquely: nodes on one host never collide

    def mpirun(self, ctx) -> list[object]:
        r = ctx.job.resources
        return ([self.record.launcher, "-n", ctx.job.world_size, "-ppn", r.tasks_per_node]
                + self.binding_args(ctx) + self.env_args(ctx.env_names))

    def binding_args(self, ctx) -> list[object]:
        bind_to = (binding(ctx, "bind_to") or "none").split(":")[0]
        map_by = (binding(ctx, "map_by") or "slot").split(":")[0]
        # Hydra's -map-by takes hardware objects only; Open MPI's slot and node orders are
        # what -ppn already gives
        mapping = [] if map_by in ("slot", "node") or map_by.startswith("ppr") else ["-map-by", map_by]
        return ["-bind-to", bind_to, *mapping]

    def env_args(self, names) -> list[object]:
        return ["-genvlist", ",".join(names)] if names else []

    def environment(self, job, mpi) -> dict[str, str]:
        return {}

    def problems(self, job, profile) -> list[tuple[str, str]]:
        out, mpi = [], profile.mpi
        if mpi.mca != DEFAULT_MCA:
            out.append(("mpi.mca", f"MCA parameters are Open MPI's; {self.name} ignores them"))
        if job.launcher == "srun" and (mpi.srun_mpi or "").startswith("pmix"):
            out.append(("mpi.srun_mpi", f"{self.record.words} speaks PMI-2 unless it was built "
                        "with PMIx (PyPI's mpich is not): use pmi2, or check `mpichversion`"))
        if job.launcher == "mpirun":   # under srun, srun binds (resources.binding.cpu_bind)
            out += self.binding_problems(job, mpi)
        return out

    def binding_problems(self, job, mpi) -> list[tuple[str, str]]:
        out = []
        for key, value, where in _bindings(job, mpi, ("map_by", "bind_to")):
            if ":" in value:
                out.append((where, f"Hydra takes no Open MPI modifiers: {value} is passed as "
                            f"{value.split(':')[0]}"))
        return out


class IntelMpi(Mpich):
    """Intel MPI's Hydra: ``mpiexec -n N -ppn M -genvlist A,B``; it pins through I_MPI_PIN and
    I_MPI_PIN_DOMAIN rather than -bind-to."""

    record = mpis.FLAVOURS["intelmpi"]

    def binding_args(self, ctx) -> list[object]:
        return []

    def binding_problems(self, job, mpi) -> list[tuple[str, str]]:
        return [(where, f"{value}: Intel MPI places ranks with -ppn and pins them with "
                 "I_MPI_PIN_DOMAIN; it has no map-by") for key, value, where
                in _bindings(job, mpi, ("map_by",)) if value != "slot"]

    def environment(self, job, mpi) -> dict[str, str]:
        bind_to = ((job.resources.binding.bind_to or mpi.binding.bind_to) or "none").split(":")[0]
        if bind_to == "none":
            return {"I_MPI_PIN": "0"}
        return {"I_MPI_PIN_DOMAIN": bind_to}


# the launch line of each record in hpcsuite.mpis.FLAVOURS (tests/test_mpi_identity.py: of each)
FLAVOURS: dict[str, type[Flavour]] = {cls.record.name: cls
                                      for cls in (Flavour, OpenMpi5, Mpich, IntelMpi)}


def flavour(name: str) -> Flavour:
    """The flavour ``name`` (the profile's schema has refused any other)."""
    return FLAVOURS[name]()
