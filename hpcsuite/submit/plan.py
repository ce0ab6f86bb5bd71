"""Planning is pure: (job spec, site profile, templates) -> BatchRequest. Submitting it is the
runner's (:func:`hpcsuite.runner.submit`)."""

from __future__ import annotations

import json
import os
from dataclasses import field

from ..errors import UserError
from ..records import Record, record
from .. import __version__
from ..runs import rundir
from . import containers, preflight
from .containers import ContainerLaunch
from .launchers import LaunchContext, get_launcher
from .mpi_flavours import flavour
from .site_profile import MANAGED_OPTIONS, REFUSED_OPTIONS, SiteProfile
from .sbatch_header import HeaderError, check_fixed
from ..shell import Raw, join
from .spec import JobSpec
from .templating import SearchPath, render
from .tracking import with_site_uri

# Horovod reads these at hvd.init(); the template exports them for every rank.
def horovod_environment(job: JobSpec) -> dict[str, str]:
    """The HOROVOD_* variables of train.horovod, from the one table (:mod:`hpcsuite.submit.knobs`)."""
    from .knobs import environment

    files = {"timeline": Raw(rundir.in_shell(rundir.HOROVOD_TIMELINE)),
             "autotune_log": Raw(rundir.in_shell(rundir.HOROVOD_AUTOTUNE_LOG))}
    return environment(job.train.horovod, files, bool(job.train.monitor.timeline_steps))


def mpi_environment(job: JobSpec, profile: SiteProfile) -> dict[str, str]:
    """The settings the ranks of the site's MPI need (:meth:`mpi_flavours.Flavour.environment`)."""
    return flavour(profile.mpi.flavour).environment(job, profile.mpi)


@record
class ArrayPlan(Record):
    """A job array (``hpcsuite sweep``): one script, ``--array=SPEC``; element I runs the job
    hpcsuite wrote to ``ELEMENTS/I/job.json`` (the template copies it into its run directory)."""

    spec: str                         # sbatch --array: 0-9%4, or one index (a resubmission)
    elements: str                     # absolute directory of the elements' job.json
    digest: str                       # the digest of every element's job together


@record
class BatchRequest(Record):
    """Everything `submit` needs; its repr is the script, so --dry-run shows the truth."""

    job: JobSpec
    script: str
    sbatch_argv: list[str]
    run_root: str                     # runs/<name>, relative to the submit directory
    template: str                     # the template file that rendered the script
    workdir: str = field(default_factory=os.getcwd)
    spec: str | None = None           # the spec file submitted (for the run registry)
    profile: dict = field(default_factory=dict)   # the resolved site profile
    array: ArrayPlan | None = None    # a job array's, when the script runs one

    def __repr__(self) -> str:
        return self.script

    def to_json(self) -> dict:
        return {"job": self.job.name, "script": self.script, "sbatch_argv": self.sbatch_argv,
                "run_root": self.run_root, "template": self.template, "workdir": self.workdir}


# The job keys that become #SBATCH options: key -> (option, its value for a job; ``log``:
# the --output pattern).
HEADER_KEYS = {
    "name": ("job-name", lambda job, log: job.name),
    "resources.nodes": ("nodes", lambda job, log: str(job.resources.nodes)),
    "resources.tasks_per_node": ("ntasks-per-node", lambda job, log: str(job.resources.tasks_per_node)),
    "resources.cpus_per_task": ("cpus-per-task", lambda job, log: str(job.resources.cpus_per_task)),
    "resources.time": ("time", lambda job, log: job.resources.time),
    "resources.partition": ("partition", lambda job, log: job.resources.partition),
    "resources.mem": ("mem", lambda job, log: job.resources.mem),
    "output_dir": ("output", lambda job, log: log),
}
PARTITION_OPTIONS = ("account", "qos", "reservation", "constraint")
# The resources keys behind Resources.sbatch_options (extra_sbatch: one key per option).
OPTION_KEYS = {"account": "resources.account", "qos": "resources.qos",
               "constraint": "resources.constraint", "exclusive": "resources.exclusive",
               "mail-type": "resources.mail_type", "mail-user": "resources.mail_user",
               "begin": "resources.begin", "comment": "resources.comment",
               "dependency": "after", "gpus-per-node": "resources.gpus_per_node",
               "gres": "resources.gpus_per_node", "gpus-per-task": "resources.gpus_per_task",
               "ntasks": "resources.gpus_per_task"}


def dependency(after: list[str]) -> str:
    """sbatch --dependency for ``after`` once its names are job ids (:mod:`hpcsuite.runner.after`
    resolves them): ``afterok:12:13,afterany:14``; every condition must hold."""
    groups: dict[str, list[str]] = {}
    for entry in after:
        job, _, condition = entry.partition(":")
        if not job.isdigit():
            raise UserError(f"after: {job!r} is not resolved to a job id (submit resolves names "
                            "from the run registry)")
        groups.setdefault("after" + (condition or "ok"), []).append(job)
    return ",".join(":".join([kind, *jobs]) for kind, jobs in groups.items())


def gpu_options(job: JobSpec, gpu_request: str = "gpus-per-node") -> list[tuple[str, str]]:
    """How the job's GPUs are asked of Slurm: per node as the site asks (``gpu_request``:
    --gpus-per-node=N or --gres=gpu:N), or per task (--gpus-per-task=G, which Slurm accepts
    only with a task count: --ntasks)."""
    r = job.resources
    if r.gpus_per_task:
        return [("ntasks", str(job.world_size)), ("gpus-per-task", str(r.gpus_per_task))]
    if r.gpus_per_node:
        return [("gres", f"gpu:{r.gpus_per_node}") if gpu_request == "gres"
                else ("gpus-per-node", str(r.gpus_per_node))]
    return []


def header_options(job: JobSpec, partition, gpu_request: str = "gpus-per-node"
                   ) -> list[tuple[str, str | None]]:
    """The #SBATCH options beyond the core ones: the GPUs, the resources' own
    (Resources.sbatch_options) and the dependency on ``after``."""
    options = gpu_options(job, gpu_request) + job.resources.sbatch_options(partition)
    if job.after:
        options.append(("dependency", dependency(job.after)))
    return options


def requested_options(job: JobSpec, partition, locks: tuple[str, ...],
                      gpu_request: str = "gpus-per-node"
                      ) -> tuple[dict[str, str | None], dict[str, str]]:
    """The options the job's resources ask for, each of which must reach sbatch exactly as
    asked (whatever the template), and the locked ones it leaves unset, which no template may
    add."""
    from .sbatch_header import FLAG

    fixed: dict[str, str | None] = {}
    why: dict[str, str] = {}
    def lock_of(key: str) -> str | None:
        return next((l for l in locks if key == l or key.startswith(l + ".")), None)

    for option, value in header_options(job, partition, gpu_request):
        key = OPTION_KEYS.get(option, f"resources.extra_sbatch.{option}")
        fixed[option] = FLAG if value is None else value
        lock = lock_of(key)
        why[option] = f"the site locks {lock}" if lock else f"{key} asks for it"
    for option, key in OPTION_KEYS.items():
        lock = lock_of(key)
        if lock and option not in fixed:
            fixed[option], why[option] = None, f"the site locks {lock}"
    return fixed, why


def check_allowed(found: dict, partition, partition_name: str | None, source: str) -> None:
    """The account and QOS sbatch reads must be on the partition's allow-lists."""
    for option, allowed in (("account", "allow_accounts"), ("qos", "allow_qos")):
        choices = getattr(partition, allowed, None) if partition else None
        got = found.get(option)
        if choices and got is not None and got.value not in choices:
            raise HeaderError(f"{source}:{got.line}: #SBATCH --{option}={got.value[:40]!r} is not "
                              f"allowed on partition {partition_name} ({', '.join(choices)})")


def fixed_options(job: JobSpec, profile: SiteProfile, locks: tuple[str, ...],
                  run_root: str, array: ArrayPlan | None = None
                  ) -> tuple[dict[str, str | None], dict[str, str]]:
    """The #SBATCH options the site decides, with the value each must have, and why; and
    ``--array``, which hpcsuite alone writes: exactly the sweep's, or none."""
    fixed: dict[str, str | None] = {}
    why: dict[str, str] = {}
    log = rundir.slurm_log_pattern(run_root, array is not None)
    for key, (option, value) in HEADER_KEYS.items():
        lock = next((l for l in locks if key == l or key.startswith(l + ".")), None)
        if lock:
            fixed[option] = value(job, log)
            why[option] = f"the site locks {lock}"
    fixed["array"] = array.spec if array else None
    why["array"] = ("hpcsuite writes it for the sweep's elements" if array else
                    "hpcsuite submits one job here; `hpcsuite sweep` submits job arrays")
    partition = profile.partitions.get(job.resources.partition or "")
    for option in PARTITION_OPTIONS if partition else ():
        if getattr(partition, option):
            fixed[option] = getattr(partition, option)
            why[option] = f"the site profile sets it for partition {job.resources.partition}"
    requested, reasons = requested_options(job, partition, locks, profile.gpu_request)
    for option in requested:
        if option not in fixed:
            fixed[option], why[option] = requested[option], reasons[option]
    return fixed, why


def asked_options(job: JobSpec, array: ArrayPlan | None = None) -> set[str]:
    """The #SBATCH options the built-in template writes for ``job`` beyond the ones
    :func:`fixed_options` pins (the job's resources and ``after``)."""
    r, preemption = job.resources, job.train.preemption
    asked = {"job-name", "nodes", "ntasks-per-node", "cpus-per-task", "time", "output"}
    asked |= {o for o, v in (("partition", r.partition), ("mem", r.mem), ("array", array)) if v}
    if preemption.signal_lead(job.train.checkpoint.enabled):
        asked.add("signal")
    if preemption.requeue or preemption.max_failures:
        asked |= {"requeue", "open-mode"}
    return asked


def unasked_problem(option: str, asked: set[str], allowed: list[str], strict: bool) -> str | None:
    """Why the header may not carry ``option``, which the job did not ask for (None: it may).
    ``strict``: a template the site did not write (a user's, a project's, --template-dir's)
    adds none that breaks a job under hpcsuite, and no other unless the site lists it in
    sbatch_allowed. The site's own templates are the site's word (`templates validate` and
    lint's Slurm rules read them)."""
    if option in asked or not strict:
        return None
    if option in REFUSED_OPTIONS:
        return f"{REFUSED_OPTIONS[option]}; sbatch_allowed cannot allow it"
    if option in allowed:
        return None
    if option in MANAGED_OPTIONS:
        return (f"hpcsuite writes it from {MANAGED_OPTIONS[option]}, which this job leaves "
                "unset; set that key in the spec instead")
    listed = ", ".join(allowed) if allowed else "none"
    return (f"the job does not ask for it and the site's sbatch_allowed does not list it "
            f"(it lists: {listed}); only the site's own templates add other options")


def check_header(script: str, job: JobSpec, profile: SiteProfile, locks: tuple[str, ...],
                 run_root: str, source: str, array: ArrayPlan | None = None,
                 strict: bool = True) -> None:
    """Read the rendered header as sbatch will and refuse what breaks the site's rules:
    ``strict``, for a template the site did not write, also any option the job did not ask
    for that the site does not list in sbatch_allowed."""
    from .values import walltime_seconds

    fixed, why = fixed_options(job, profile, locks, run_root, array)
    asked = asked_options(job, array)
    found = check_fixed(script, fixed, source, why, lambda option: unasked_problem(
        option, asked, profile.sbatch_allowed, strict))
    got = found.get("time")
    partition_name = found["partition"].value if "partition" in found else job.resources.partition
    partition = profile.partitions.get(partition_name or "")
    check_allowed(found, partition, partition_name, source)
    if got is None:
        return
    try:
        seconds = walltime_seconds(got.value or "")
    except ValueError:
        raise HeaderError(f"{source}:{got.line}: #SBATCH --time={got.value[:40]!r} is not a time "
                          "hpcsuite can check against the site's limits") from None
    if seconds == 0 and not profile.allow_unlimited_time:
        raise HeaderError(f"{source}:{got.line}: #SBATCH --time={got.value} asks for no time limit, "
                          "which this site does not allow")
    if partition and partition.max_time and seconds > walltime_seconds(partition.max_time):
        raise HeaderError(f"{source}:{got.line}: #SBATCH --time={got.value} is longer than "
                          f"partition {partition_name} allows ({partition.max_time})")


def launch_line(job: JobSpec, profile: SiteProfile, args: list, environment: dict
                ) -> tuple[str, ContainerLaunch]:
    """The launcher's command that runs ``python ARGS`` on every rank (in the job's container
    when it has one), and the container's launch."""
    container = ContainerLaunch(command=(profile.interpreter(), *args))
    if job.container.image is not None:
        container = containers.launch(job, profile.container, args)
    ctx = LaunchContext(job=job, mpi=profile.mpi, command=container.command,
                        env_names=("PATH", rundir.ENV, *container.env_names, *environment),
                        srun_options=container.srun_options, python=profile.interpreter())
    return join(get_launcher(job.launcher).argv(ctx)), container


def plan(job: JobSpec, profile: SiteProfile, path: SearchPath,
         locks: tuple[str, ...] = (), array: ArrayPlan | None = None) -> BatchRequest:
    """Render the script for ``job``; ``locks``: the site's locked keys (Resolved.locks);
    ``array``: render it as a job array whose elements' jobs hpcsuite has written (every
    element's script must then come out the same: :mod:`hpcsuite.sweep` checks)."""
    job = with_site_uri(job, profile)     # the job.json the ranks read names the site's URI
    environment = {**horovod_environment(job), **mpi_environment(job, profile), **job.env}
    args = ["-m", "hpcsuite", "train", "--job", Raw(rundir.in_shell(rundir.JOB))]
    launch, container = launch_line(job, profile, args, environment)
    checks = preflight.args(job, profile)
    run_root = rundir.run_root(job.output_dir, job.name)
    template_file = path.which(job.template)
    site_written = path.layer_of(template_file) in ("site", "builtin")
    partition = profile.partitions.get(job.resources.partition or "")
    signal_lead = job.train.preemption.signal_lead(job.train.checkpoint.enabled)
    context = {
        "job": job,
        "site": profile,
        "partition": partition,
        "sbatch_options": header_options(job, partition, profile.gpu_request),
        "version": __version__,
        "template_name": job.template,
        "digest": array.digest if array else job.digest(),
        "paths": {"run_root": run_root, "log": rundir.slurm_log_pattern(run_root, bool(array)),
                  "run_name": Raw(rundir.shell_run_name(bool(array)))},
        "array": {"spec": array.spec, "elements": array.elements} if array else None,
        "rundir": {key: Raw(name) for key, name in rundir.RunDir.template_names().items()},
        "module_init": Raw(profile.module_init) if profile.module_init else None,
        "module_paths": list(profile.module_paths),
        "modules": list(profile.modules),
        "setup": [Raw(line) for line in profile.setup],
        "container_setup": list(container.setup),
        "environment": environment,
        "job_json": Raw(json.dumps(job.to_dict(), sort_keys=True, ensure_ascii=True)),
        "launch": launch,
        "preflight": launch_line(job, profile, checks, environment)[0] if checks else None,
        "preemption": job.train.preemption,
        "signal_lead": signal_lead,
        # Catch signals in the batch shell whenever a checkpoint could be saved on them, and
        # whenever Slurm is asked for a warning signal: untrapped, it kills the batch shell
        # (and so the job) unrecorded; trapped, the ranks stop and the attempt says so.
        "forward_signals": job.train.checkpoint.enabled or signal_lead > 0,
        "python": profile.interpreter(),
        # where the MPI's own launcher takes a TERM as an abort (Open MPI 5's prterun)
        "launcher_signals": (flavour(profile.mpi.flavour).launcher_signals(job.train.preemption.signal)
                             if job.launcher == "mpirun" else None),
        "world_size": job.resources.nodes * job.resources.tasks_per_node,
    }
    script = render(path, job.template, context)
    check_header(script, job, profile, locks, run_root, f"{template_file} (rendered)", array,
                 strict=not site_written)
    from .schema import to_dict

    return BatchRequest(job=job, script=script, sbatch_argv=["sbatch", "--parsable"],
                        run_root=run_root, template=str(template_file), profile=to_dict(profile),
                        array=array)
