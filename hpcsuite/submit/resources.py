"""What a job asks of Slurm: ``resources`` (nodes, ranks, CPUs, GPUs, time, account, ...)
and ``resources.binding`` (how ranks are pinned to CPUs and GPUs), with the checks of free
text that reaches an #SBATCH line. Part of the job spec (:mod:`.spec`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal, Optional, Union

from ..records import Record, meta, record
from .values import (BEGIN, BEGIN_HELP, BIND_TO, CONSTRAINT, CONSTRAINT_HELP, CPU_BIND, EMAIL,
                     GPU_BIND, MAIL_TYPES, MAP_BY, NAME, NAME_HELP, WALLTIME, WALLTIME_HELP)


def begin_problem(text: str) -> str | None:
    """Why a --begin time matching BEGIN is not a real time of day or date (2026-02-30)."""
    import datetime as dt

    date, _, clock = text.partition("T") if text[:1].isdigit() and "-" in text else ("", "", text)
    try:
        if date:
            dt.date.fromisoformat(date)
        if clock[:1].isdigit():
            parts = [int(p) for p in clock.split(":")] + [0]
            dt.time(parts[0], parts[1], parts[2])
    except ValueError as e:
        return f"{text!r} is not a valid time: {e}"
    return None


def header_text_problem(text: str) -> str | None:
    """Why free text (a comment, an extra sbatch value) cannot go into an #SBATCH line even
    quoted for sbatch: control characters, and the heterogeneous-job words sbatch looks for
    anywhere on a line."""
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        return f"control character {bad!r} is not allowed"
    lowered = text.lower()
    word = next((w for w in ("hetjob", "packjob") if w in lowered), None)
    if word:
        return f"{word!r} is not allowed: sbatch reads it anywhere in its header as a job separator"
    return None


@record
class Binding(Record):
    """How ranks are pinned to CPUs; unset keys come from the site profile's mpi.binding."""
    bind_to: Optional[str] = field(default=None, metadata=meta(
        "mpirun --bind-to: none, core, socket, hwthread, numa, l3cache, ... (site default: none)",
        pattern=BIND_TO, pattern_help="OpenMPI's --bind-to: none, hwthread, core, l2cache, "
        "l3cache, socket, package, numa or board, with :overload-allowed or :if-supported"))
    map_by: Optional[str] = field(default=None, metadata=meta(
        "mpirun --map-by: slot, node, core, socket, numa, ppr:N:socket, with :PE=N, ... "
        "(site default: slot)", pattern=MAP_BY, pattern_help="OpenMPI's --map-by: slot, node, "
        "core, socket, numa, ... or ppr:N:PLACE, with modifiers like :PE=2 or :span"))
    cpu_bind: Optional[str] = field(default=None, metadata=meta(
        "srun --cpu-bind: none, cores, threads, sockets, ldoms, rank, map_cpu:0,2, ... with an "
        "optional verbose, (site default: unset, Slurm's own)", pattern=CPU_BIND,
        pattern_help="srun's --cpu-bind: [verbose,]none, cores, threads, sockets, ldoms, "
        "boards, rank, rank_ldom, or map_cpu:/mask_cpu:/map_ldom:/mask_ldom: with a list"))
    gpu_bind: Optional[str] = field(default=None, metadata=meta(
        "srun --gpu-bind: closest, none, single:N (N tasks per GPU), map_gpu:0,1, ... (site "
        "default: unset; under mpirun, hpcsuite gives each rank the GPU of its local rank)",
        pattern=GPU_BIND, pattern_help="srun's --gpu-bind: [verbose,]closest, none, single:N, "
        "per_task:N, or map_gpu:/mask_gpu: with a list"))


@record
class Resources(Record):
    """What the job asks of Slurm: nodes, ranks, cores, GPUs, memory and time."""
    nodes: int = field(default=1, metadata=meta("nodes to allocate", min=1, max=100000))
    tasks_per_node: int = field(default=1, metadata=meta("MPI ranks per node", min=1, max=1024))
    cpus_per_task: int = field(default=1, metadata=meta("CPU cores per rank", min=1, max=1024))
    gpus_per_node: int = field(default=0, metadata=meta(
        "GPUs per node (one rank per GPU: each rank sees only its own, by local rank)",
        min=0, max=64))
    gpu_sharing: bool = field(default=False, metadata=meta(
        "true: more ranks per node than gpus_per_node is meant, local ranks take the node's GPUs "
        "in turn (NCCL refuses two ranks of one job on one GPU: for CPU collectives or MPS); "
        "false (default): such a job is refused and no two ranks ever share a GPU"))
    gpus_per_task: int = field(default=0, metadata=meta(
        "GPUs per rank instead of per node (sbatch --gpus-per-task with --ntasks; launcher srun "
        "only: Slurm gives them to each task it starts)", min=0, max=64))
    time: str = field(default="00:10:00", metadata=meta(
        "walltime", pattern=WALLTIME, pattern_help=WALLTIME_HELP, coerce=True))
    partition: Optional[str] = field(default=None, metadata=meta(
        "Slurm partition", pattern=NAME, pattern_help=NAME_HELP, check=header_text_problem))
    mem: Optional[str] = field(default=None, metadata=meta(
        "memory per node, e.g. 4G", pattern=r"[1-9]\d{0,11}[KMGT]?",
        pattern_help="a number with K, M, G or T, e.g. 4G", coerce=True))
    account: Optional[str] = field(default=None, metadata=meta(
        "account the job is charged to (sbatch --account); the partition's allow_accounts apply",
        pattern=NAME, pattern_help=NAME_HELP, check=header_text_problem))
    qos: Optional[str] = field(default=None, metadata=meta(
        "quality of service (sbatch --qos); the partition's allow_qos apply",
        pattern=NAME, pattern_help=NAME_HELP, check=header_text_problem))
    constraint: Optional[str] = field(default=None, metadata=meta(
        "node features the job requires (sbatch --constraint), e.g. skylake&ib",
        pattern=CONSTRAINT, pattern_help=CONSTRAINT_HELP, check=header_text_problem))
    exclusive: Union[bool, Literal["user", "mcs"]] = field(default=False, metadata=meta(
        "whole nodes (sbatch --exclusive): true, false, user (shared with your own jobs only) "
        "or mcs", union_help="true, false, user or mcs"))
    mail_type: list[Literal[MAIL_TYPES]] = field(default_factory=list, metadata=meta(
        "when Slurm mails (sbatch --mail-type): a list or END,FAIL of " + ", ".join(MAIL_TYPES),
        split=",", upper=True))
    mail_user: Optional[str] = field(default=None, metadata=meta(
        "who Slurm mails (sbatch --mail-user); default: the submitting user",
        pattern=EMAIL, pattern_help="an e-mail address like ada@example.org", check=header_text_problem))
    begin: Optional[str] = field(default=None, metadata=meta(
        "start no earlier than (sbatch --begin)", pattern=BEGIN, pattern_help=BEGIN_HELP,
        check=begin_problem))
    comment: Optional[str] = field(default=None, metadata=meta(
        "free text Slurm keeps with the job (sbatch --comment)", max_length=1000, nonempty=True,
        check=header_text_problem))
    extra_sbatch: dict[str, Union[bool, str]] = field(default_factory=dict, metadata=meta(
        "other sbatch long options, name -> value (true for one without a value), only those "
        "the site lists in sbatch_allowed", key_pattern=r"[a-z][a-z0-9-]{0,63}",
        key_help="not an sbatch long option name (write reservation, not --reservation)",
        keys="sbatch long option names without the leading -- (reservation)",
        values={"coerce": True, "max_length": 1000, "nonempty": True,
                "check": header_text_problem}))
    binding: Binding = field(default_factory=Binding, metadata=meta(
        "how ranks are pinned to CPUs; unset keys come from the site profile's mpi.binding"))

    @property
    def gpus_on_node(self) -> int:
        """The GPUs a node gives the job: per node, or per task times its tasks there."""
        return self.gpus_per_node or self.gpus_per_task * self.tasks_per_node

    @property
    def gpu_key(self) -> str:
        return "resources.gpus_per_task" if self.gpus_per_task else "resources.gpus_per_node"

    # sbatch options a partition of the site profile may set for every job on it.
    PARTITION_OPTIONS = ("account", "qos", "reservation", "constraint")

    def sbatch_options(self, partition: Any = None) -> list[tuple[str, Optional[str]]]:
        """The #SBATCH options beyond the core ones, in header order, as (long option, value);
        value None: an option without a value. The job's account, QOS and constraint win
        over its partition's (config.resolve refuses a job that contradicts the site)."""
        out: list[tuple[str, Optional[str]]] = []
        for option in self.PARTITION_OPTIONS:
            value = getattr(self, option, None) or getattr(partition, option, None)
            if value:
                out.append((option, value))
        if self.exclusive is not False:
            out.append(("exclusive", None if self.exclusive is True else self.exclusive))
        if self.mail_type:
            out.append(("mail-type", ",".join(self.mail_type)))
        for option in ("mail-user", "begin", "comment"):
            value = getattr(self, option.replace("-", "_"))
            if value is not None:
                out.append((option, value))
        for option, value in self.extra_sbatch.items():
            if value is not False:
                out.append((option, None if value is True else value))
        return out
