"""The site profile: what the cluster looks like and how jobs start on it.

A sysadmin writes it once (``$HPCSUITE_SITE_DIR/profile.yaml`` or ``/etc/hpcsuite/profile.yaml``);
users and projects may add their own layers (see :mod:`hpcsuite.submit.config`).
"""

from __future__ import annotations

import sys
from dataclasses import field
from typing import Literal, Optional, Union

from ..fabrics import unknown_preset
from ..records import Record, meta, record
from .spec import (CONSTRAINT, CONSTRAINT_HELP, NAME, NAME_HELP, WALLTIME, WALLTIME_HELP, Binding,
                   path_problem)
from .mpi_flavours import DEFAULT_MCA
from .tracking import URI_HELP, uri_problem
from .values import BIND, BIND_HELP, IMAGE_PATTERN, IMAGE_PATTERN_HELP

MODULE = r"[A-Za-z0-9_.+/@:-]{1,256}"

# sbatch options hpcsuite writes itself, from these job keys: a site lists them in
# sbatch_allowed in vain (users set the key; the site locks it).
MANAGED_OPTIONS = {
    "job-name": "name", "nodes": "resources.nodes", "ntasks-per-node": "resources.tasks_per_node",
    "cpus-per-task": "resources.cpus_per_task", "gpus-per-node": "resources.gpus_per_node",
    "gres": "resources.gpus_per_node", "gpus-per-task": "resources.gpus_per_task",
    "gpu-bind": "resources.binding.gpu_bind",
    "time": "resources.time", "partition": "resources.partition", "mem": "resources.mem",
    "output": "output_dir", "account": "resources.account", "qos": "resources.qos",
    "constraint": "resources.constraint", "exclusive": "resources.exclusive",
    "mail-type": "resources.mail_type", "mail-user": "resources.mail_user",
    "begin": "resources.begin", "comment": "resources.comment", "dependency": "after",
    "signal": "train.preemption.lead_seconds", "requeue": "train.preemption.requeue",
    "open-mode": "train.preemption.requeue",
}
# sbatch options that would break how a job runs under hpcsuite, whatever a site allows.
REFUSED_OPTIONS = {
    "wrap": "it replaces the script", "chdir": "run directories are relative to the submit "
    "directory", "error": "the job's log is its run directory's slurm-%j.out",
    "input": "ranks read no standard input", "export": "hpcsuite exports the job's environment",
    "export-file": "hpcsuite exports the job's environment",
    "get-user-env": "hpcsuite exports the job's environment", "uid": "root only", "gid": "root only",
    "array": "hpcsuite writes it for `hpcsuite sweep`, limited by the profile's "
             "sweep_max_parallel",
    "help": "not a job option", "usage": "not a job option", "version": "not a job option",
    "parsable": "not a job option", "test-only": "not a job option", "wait": "submit --wait waits",
    "batch": "not a job option", "ignore-pbs": "not a job option", "no-requeue":
    "train.preemption decides requeueing", "ntasks": "resources.nodes x tasks_per_node",
    "tasks-per-node": "resources.tasks_per_node", "nodefile": "hpcsuite places ranks itself",
}


def sbatch_allowed_problem(option: str) -> str | None:
    """Why a site may not list ``option`` in sbatch_allowed (None: it may)."""
    from .sbatch_header import LONG

    if option in MANAGED_OPTIONS:
        return f"hpcsuite writes --{option} from {MANAGED_OPTIONS[option]}; lock that key instead"
    if option in REFUSED_OPTIONS:
        return f"--{option} cannot be passed through hpcsuite ({REFUSED_OPTIONS[option]})"
    if option not in LONG:
        from ..errors import close_match

        return f"--{option} is not an sbatch option (Slurm 22.05){close_match(option, LONG)}"
    return None


@record
class Partition(Record):
    """One Slurm partition as the site describes it."""
    cpus_per_node: Optional[int] = field(default=None, metadata=meta("cores per node", min=1))
    gpus_per_node: int = field(default=0, metadata=meta("GPUs per node", min=0))
    max_time: Optional[str] = field(default=None, metadata=meta(
        "longest walltime", pattern=WALLTIME, pattern_help=WALLTIME_HELP, coerce=True))
    account: Optional[str] = field(default=None, metadata=meta(
        "account every job on this partition is charged to", pattern=NAME, pattern_help=NAME_HELP))
    qos: Optional[str] = field(default=None, metadata=meta(
        "QOS every job on this partition runs under", pattern=NAME, pattern_help=NAME_HELP))
    reservation: Optional[str] = field(default=None, metadata=meta(
        "reservation every job on this partition uses", pattern=NAME, pattern_help=NAME_HELP))
    constraint: Optional[str] = field(default=None, metadata=meta(
        "node features every job on this partition requires", pattern=CONSTRAINT,
        pattern_help=CONSTRAINT_HELP))
    allow_accounts: list[str] = field(default_factory=list, metadata=meta(
        "accounts a job on this partition may choose with resources.account (empty: any)",
        pattern=NAME, pattern_help=NAME_HELP))
    allow_qos: list[str] = field(default_factory=list, metadata=meta(
        "QOS a job on this partition may choose with resources.qos (empty: any)",
        pattern=NAME, pattern_help=NAME_HELP))


@record
class Mpi(Record):
    """The MPI the ranks use and how the site launches it."""
    flavour: Literal["openmpi", "openmpi5", "mpich", "intelmpi"] = field(
        default="openmpi", metadata=meta(
            "the MPI library the ranks use: openmpi (4.x), "
            "openmpi5, mpich or intelmpi; it decides the launch line of launcher: mpirun "
            "(Open MPI's mpirun, Hydra's mpiexec for mpich and intelmpi), how the environment "
            "and binding reach the ranks, and srun's default --mpi plugin"))
    srun_mpi: Optional[str] = field(default=None, metadata=meta(
        "srun --mpi plugin (default: pmix for Open MPI, pmi2 for mpich and intelmpi)",
        pattern=r"pmix(_v\d)?|pmi2|none", pattern_help="pmix, pmix_vN, pmi2 or none"))
    # Horovod's runner uses these with OpenMPI: ob1 over TCP/shared memory and no openib BTL,
    # which warns and can hang with fork(). InfiniBand sites usually set pml: ucx.
    mca: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MCA),
                                metadata=meta("Open MPI MCA parameters for mpirun (--mca KEY "
                                              "VALUE); mpich and intelmpi have none",
                                            key_pattern=r"[a-z][a-z0-9_]*",
                                            key_help="not an MCA parameter name",
                                            keys="MCA parameter names"))
    nodes_share_host: bool = field(default=False, metadata=meta(
        "the site's Slurm nodes are several slurmd on one machine (as `hpcsuite cluster up` "
        "runs them): each node's ranks get their own Open MPI shared-memory directory, whose "
        "segments would otherwise collide between nodes"))
    mpirun_args: list[str] = field(default_factory=list, metadata=meta(
        "extra arguments of the MPI's own launcher (mpirun, or mpiexec for mpich and intelmpi)"))
    srun_args: list[str] = field(default_factory=list, metadata=meta("extra srun arguments"))
    binding: Binding = field(default_factory=lambda: Binding("none", "slot", None), metadata=meta(
        "CPU binding: mpirun --bind-to/--map-by and srun --cpu-bind; a job's "
        "resources.binding overrides it unless the site locks resources.binding"))

    def srun_plugin(self) -> str:
        """srun's --mpi plugin: the profile's, else the one the flavour's MPI speaks."""
        from .mpi_flavours import flavour

        return self.srun_mpi or flavour(self.flavour).srun_mpi


@record
class FabricLink(Record):
    """One kind of link: its bus bandwidth and latency."""
    bandwidth: float = field(default=1.0, metadata=meta(
        "achievable bus bandwidth in GB/s (nccl-tests' busbw of large allreduces)",
        min=0.001, max=100000.0))
    latency: float = field(default=10.0, metadata=meta("latency per ring step in us",
                                                     min=0.0, max=1000000.0))


@record
class SiteFabric(FabricLink):
    """The interconnect between the site's GPUs, as the step model and the preflight see it."""
    topology: Literal["flat", "two-level"] = field(default="flat", metadata=meta(
        "flat: one ring over every GPU; two-level: a ring inside each node, one across nodes"))
    intra_node: Optional[FabricLink] = field(default=None, metadata=meta(
        "the link between the GPUs of one node (default: the same as between nodes)"))
    source: Optional[str] = field(default=None, metadata=meta(
        "where the figures come from (measured with `hpcsuite bench allreduce` on a date, a "
        "vendor's number, a nominal guess); `doctor` prints it beside them", max_length=200))


@record
class ContainerSite(Record):
    """How this site runs ranks in containers (a job names its image in container.image)."""
    runtime: Optional[Literal["apptainer", "singularity", "pyxis", "charliecloud"]] = field(
        default=None, metadata=meta(
            "what starts a job's container.image: apptainer or singularity (`exec`, under "
            "mpirun or srun), pyxis (srun --container-image; launcher srun only) or "
            "charliecloud (ch-run, under mpirun or srun); unset: jobs cannot ask for an image"))
    allowed_images: list[str] = field(default_factory=list, metadata=meta(
        "the images jobs may run: an image, a prefix ending in / or # (a registry, a "
        "directory) or a glob (* and ? stop at /); empty: any image",
        pattern=IMAGE_PATTERN, pattern_help=IMAGE_PATTERN_HELP, check=path_problem))
    binds: list[str] = field(default_factory=list, metadata=meta(
        "host paths every job's container gets, HOST or HOST:GUEST (e.g. /scratch)",
        pattern=BIND, pattern_help=BIND_HELP, check=path_problem))
    options: list[str] = field(default_factory=list, metadata=meta(
        "extra runtime arguments before the image (trusted: written by the site), e.g. "
        "--nv, --no-home (apptainer), --container-remap-root (pyxis); not --cleanenv: the "
        "ranks need the job's environment (HOROVOD_*, HPCSUITE_RUN_DIR)"))
    python: str = field(default="python3", metadata=meta(
        "the interpreter inside the image that runs `hpcsuite train` (hpcsuite must be "
        "installed in the image)", pattern=r"[A-Za-z0-9_.+@/-]{1,1024}",
        pattern_help="a command name or absolute path"))


@record
class SiteProfile(Record):
    """What a site says of its cluster: partitions, MPI, modules, Python, locks."""
    name: Optional[str] = field(default=None, metadata=meta("cluster name", pattern=NAME,
                                                          pattern_help="letters, digits, _ . -"))
    contact: Optional[str] = field(default=None, metadata=meta(
        "who users talk to about locked keys, e.g. hpc-support@example.org", max_length=200))
    pinned: bool = field(default=False, metadata=meta(
        "in /etc/hpcsuite/profile.yaml: this is the only site profile; --profile, "
        "HPCSUITE_PROFILE and HPCSUITE_SITE_DIR are refused"))
    allow_unlimited_time: bool = field(default=False, metadata=meta(
        "accept resources.time 0 (no time limit)"))
    python: Optional[str] = field(default=None, metadata=meta(
        "interpreter that runs `hpcsuite train` on compute nodes "
        "(default: the one running hpcsuite at submit time)"))
    module_init: Optional[str] = field(default=None, metadata=meta(
        "shell line that makes `module` available in batch jobs, e.g. "
        "source /usr/share/modules/init/bash (trusted: written by the site)"))
    module_paths: list[str] = field(default_factory=list, metadata=meta(
        "directories of modulefiles (module use DIR)"))
    modules: list[str] = field(default_factory=list, metadata=meta(
        "environment modules loaded before training", pattern=MODULE,
        pattern_help="a module name like openmpi/4.1.4"))
    setup: list[str] = field(default_factory=list, metadata=meta(
        "shell lines run before training (trusted: written by the site)"))
    partitions: dict[str, Partition] = field(default_factory=dict, metadata=meta(
        "the cluster's partitions and what every job on each one gets", key_pattern=NAME,
        key_help=f"not a partition name ({NAME_HELP})",
        keys="partition names"))
    mpi: Mpi = field(default_factory=Mpi)
    gpu_request: Literal["gpus-per-node", "gres"] = field(default="gpus-per-node", metadata=meta(
        "how a job's resources.gpus_per_node is asked of Slurm: --gpus-per-node=N, or "
        "--gres=gpu:N (Slurm before 19.05, or a site that counts GPUs by gres only)"))
    fabric: Optional[Union[SiteFabric, str]] = field(default=None, metadata=meta(
        "the network between nodes for `hpcsuite study predict`: a preset name or "
        "{bandwidth: GB/s, latency: us, topology: flat|two-level, intra_node: {bandwidth, "
        "latency}}", check=unknown_preset))
    container: ContainerSite = field(default_factory=ContainerSite)
    sbatch_allowed: list[str] = field(default_factory=list, metadata=meta(
        "sbatch long options users may pass with resources.extra_sbatch, e.g. [licenses, "
        "reservation]", pattern=r"[a-z][a-z0-9-]{0,63}",
        pattern_help="an sbatch long option name without --", check=sbatch_allowed_problem))
    sweep_max_parallel: int = field(default=4, metadata=meta(
        "elements of one sweep (a job array) that run at once: the default of a sweep's "
        "max_parallel and its ceiling (sbatch --array=...%K)", min=1, max=10000))
    tracking_uri: Optional[str] = field(default=None, metadata=meta(
        "the site's MLflow tracking URI, for jobs with train.tracking.mlflow that name none: "
        + URI_HELP, check=uri_problem, nonempty=True, omit_unset=True))

    def interpreter(self) -> str:
        return self.python or sys.executable
