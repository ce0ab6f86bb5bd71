"""Checks of a resolved job against the site before anything is submitted.

``hpcsuite lint`` prints them; ``render`` and ``submit`` run them too (through
:func:`hpcsuite.runner.prepare`): errors stop them,
warnings are printed. Every finding names the job key it is about.
"""

from __future__ import annotations

from pathlib import Path

from ..records import Record, record
from ..errors import close_match, count
from .values import walltime_seconds
from .site_profile import SiteProfile
from .spec import JobSpec


@record
class Finding(Record):
    """One thing lint found: its level, the job key, what it says."""
    level: str      # "error" or "warning"
    key: str        # dotted job key
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


def user_code_findings(job: JobSpec, base: Path | None = None) -> list[Finding]:
    """Each FILE.py:function in the spec exists and defines that function (read, not run)."""
    from .. import usercode

    t = job.train
    dirs = usercode.search_dirs(t.pythonpath, base)
    refs = [("train.model", t.model), ("train.loss", t.loss)]
    if t.script is None:
        refs.append(("train.data.factory", t.data.factory))
        if t.eval is not None and t.eval.data is not None:
            refs.append(("train.eval.data.factory", t.eval.data.factory))
    out = []
    for key, text in refs:
        ref = usercode.parse(text) if text else None
        problem = usercode.check(ref, dirs) if ref else None
        if problem:
            out.append(Finding("error", key, problem))
    if t.script is not None:
        script = Path(t.script) if Path(t.script).is_absolute() else (base or Path.cwd()) / t.script
        if not script.is_file():
            out.append(Finding("error", "train.script", f"{t.script}: no such file (in "
                                                         f"{script.parent}){_file_like(script)}"))
        else:
            problem = usercode.compile_problem(script, t.script)
            if problem:
                out.append(Finding("error", "train.script", problem))
    if t.model_args and (usercode.parse(t.model) is None or t.script is not None):
        why = "script mode builds its own model" if t.script is not None else \
            f"the built-in model {t.model!r} takes none"
        out.append(Finding("error", "train.model_args", f"arguments for a FILE.py:function "
                                                       f"model builder; {why}"))
    data_needs = {"python": ("factory", "a FILE.py:function"), "npy": ("path", "a directory"),
                  "hdf5": ("path", "an .h5 file")}
    for key, data in (("train.data", t.data), ("train.eval.data", t.eval.data if t.eval else None)):
        if data is None or t.script is not None:
            continue
        need = data_needs.get(data.kind)
        if need and getattr(data, need[0]) is None:
            out.append(Finding("error", f"{key}.{need[0]}", f"required for kind {data.kind}: {need[1]}"))
    return out


def _file_like(path: Path) -> str:
    """' (did you mean "Train.py"?)' for a file beside ``path`` whose name differs only in
    case, or is close to it, else ''."""
    try:
        names = [p.name for p in path.parent.iterdir() if p.is_file()]
    except OSError:
        return ""
    same = [n for n in names if n.lower() == path.name.lower()]
    return f' (did you mean "{same[0]}"?)' if same else close_match(path.name, names)


def ignored_findings(job: JobSpec, origins: dict[str, str]) -> list[Finding]:
    """Keys a spec set that the job would ignore: script mode builds its own model, so a
    train.model given beside train.script is refused rather than silently dropped (as
    train.model_args and train.horovod.allreduce are). ``origins``: the resolved keys'
    layers (``builtin`` for a default)."""
    # A study's or sweep's points carry the resolved spec, where the default model reads as
    # given: the default is never the user's word there.
    default = type(job.train)().model
    given = origins.get("job.train.model", "builtin") != "builtin" and job.train.model != default
    if job.train.script is None or not given:
        return []
    return [Finding("error", "train.model", f"{job.train.model!r} is ignored in script mode: "
                                            f"train.script {job.train.script!r} builds its own "
                                            "model; remove train.model (or train.script, to "
                                            "train it in the managed loop)")]


def lint(job: JobSpec, profile: SiteProfile, base: Path | None = None) -> list[Finding]:
    from .spec import precision_problem

    out: list[Finding] = user_code_findings(job, base)
    problem = precision_problem(job.train.backend, job.train.precision)
    if problem:
        out.append(Finding("error", "train.precision", problem))
    if job.train.loss == "mse" and job.train.data.kind in ("synthetic", "npy") and not job.train.script:
        out.append(Finding("error", "train.loss", f"mse needs float targets; {job.train.data.kind} "
                                                  "data has class labels (use cross_entropy)"))
    if not job.train.horovod.allreduce:
        if job.train.script:
            out.append(Finding("error", "train.horovod.allreduce", "false has no effect in script "
                                                                   "mode: the script does its own allreduce"))
        else:
            out.append(Finding("warning", "train.horovod.allreduce",
                               "false: the ranks never exchange gradients, each trains its own "
                               "replica (a benchmark's no-communication limit, not training)"))
    if job.train.monitor.timeline_steps and job.train.horovod.timeline:
        out.append(Finding("error", "train.monitor.timeline_steps",
                           "a timeline window and train.horovod.timeline (the whole run) exclude "
                           "each other; set one"))
    r = job.resources
    out += gpu_findings(job, profile) + mpi_findings(job, profile)
    from .tracking import tracking_problems
    out += [Finding("warning", "train.tracking.mlflow", m) for m in tracking_problems(job, profile)]
    if walltime_seconds(r.time) == 0 and not profile.allow_unlimited_time:
        out.append(Finding("error", "resources.time",
                           f"{r.time!r} means no time limit, which this site does not allow; "
                           "give the walltime the job needs"))
    ck, pre = job.train.checkpoint, job.train.preemption
    if ck.enabled and pre.lead_seconds == 0:
        out.append(Finding("warning", "train.preemption.lead_seconds",
                           "0 turns off the warning signal and the ranks' own stop before the "
                           "time limit: a job that reaches it loses everything since its last "
                           "checkpoint; leave it unset (the default) or give the seconds"))
    if pre.lead_seconds and not ck.enabled:
        out.append(Finding("warning", "train.preemption.lead_seconds",
                           f"a warning signal ({pre.signal}, {pre.lead_seconds}s before the time "
                           "limit) with nothing to save: the ranks stop on it and "
                           + ("only what the script saves through run.save() survives"
                              if job.train.script else "their training is lost")
                           + "; set train.checkpoint.every_steps or every_minutes"))
    if pre.max_failures and not ck.enabled:
        out.append(Finding("warning", "train.preemption.max_failures",
                           "without checkpoints a requeued attempt starts training from scratch"))
    if pre.requeue and not ck.enabled:
        out.append(Finding("error", "train.preemption.requeue",
                           "requeue without checkpoints restarts training from scratch; set "
                           "train.checkpoint.every_steps or every_minutes"))
    if pre.lead_seconds and pre.lead_seconds >= walltime_seconds(r.time):
        out.append(Finding("error", "train.preemption.lead_seconds",
                           f"{pre.lead_seconds}s is not shorter than the walltime {r.time}"))
    if ck.every_minutes and ck.every_minutes * 60 >= walltime_seconds(r.time):
        out.append(Finding("warning", "train.checkpoint.every_minutes",
                           f"walltime {r.time} is shorter than one checkpoint interval "
                           f"({ck.every_minutes:g} min): no interval checkpoint will be saved"))
    return out + partition_findings(job, profile)


def pinned_findings(profile_path: str | None = None) -> list[Finding]:
    """The site profile's ``pinned: true`` where it does nothing (:mod:`.pinning`): a warning
    on the profile key, for `hpcsuite lint` (a user's submit cannot act on it)."""
    from .pinning import pinned_warning

    warning = pinned_warning(profile_path)
    return [Finding("warning", "pinned", warning)] if warning else []


def gpu_findings(job: JobSpec, profile: SiteProfile) -> list[Finding]:
    """GPU requests that Slurm versions or launchers treat differently, refused by key."""
    r, out = job.resources, []
    gpu_bind = r.binding.gpu_bind or profile.mpi.binding.gpu_bind
    if r.gpus_per_task and r.gpus_per_node:
        out.append(Finding("error", "resources.gpus_per_task",
                           "set gpus_per_node or gpus_per_task, not both: Slurm versions "
                           "resolve the pair differently"))
    elif r.gpus_per_task and job.launcher == "mpirun":
        out.append(Finding("error", "resources.gpus_per_task",
                           "with launcher mpirun, mpirun starts one daemon per node through "
                           "srun and Slurm gives that one task gpus_per_task GPUs: the node's "
                           "ranks would share them; use gpus_per_node, or launcher: srun"))
    elif r.gpus_per_task and profile.gpu_request == "gres":
        out.append(Finding("error", "resources.gpus_per_task",
                           "this site asks for GPUs per node (gpu_request: gres); use "
                           "gpus_per_node"))
    if r.binding.gpu_bind and r.gpus_per_task:
        out.append(Finding("error", "resources.binding.gpu_bind",
                           "with gpus_per_task, Slurm 21.08 and later bind each task to its "
                           "own GPUs (--gpu-bind=per_task) and earlier versions did not: an "
                           "explicit gpu_bind means different things; leave it unset"))
    if r.binding.gpu_bind and job.launcher == "mpirun":
        out.append(Finding("error", "resources.binding.gpu_bind",
                           "is an srun option; under mpirun hpcsuite gives each rank the GPU "
                           "of its local rank (use launcher: srun, or leave it unset)"))
    if gpu_bind and not (r.gpus_per_node or r.gpus_per_task) and r.binding.gpu_bind:
        out.append(Finding("warning", "resources.binding.gpu_bind",
                           "the job asks for no GPUs: it has no effect"))
    if r.gpus_per_node and r.tasks_per_node > r.gpus_per_node and not r.gpu_sharing:
        out.append(Finding("error", "resources.tasks_per_node",
                           f"{count(r.tasks_per_node, 'rank')} per node but resources.gpus_per_node "
                           f"is {r.gpus_per_node}: ranks would share a GPU, which NCCL refuses; "
                           "give one GPU per rank, or set resources.gpu_sharing: true if "
                           "sharing is meant"))
    elif r.gpus_per_node and r.tasks_per_node < r.gpus_per_node:
        out.append(Finding("warning", "resources.tasks_per_node",
                           f"{count(r.tasks_per_node, 'rank')} per node but "
                           f"{count(r.gpus_per_node, 'GPU')} per node; Horovod expects one "
                           "rank per GPU"))
    if r.gpu_sharing and not (r.gpus_per_node and r.tasks_per_node > r.gpus_per_node):
        out.append(Finding("warning", "resources.gpu_sharing",
                           "true has no effect: no more ranks per node than gpus_per_node"))
    return out


def mpi_findings(job: JobSpec, profile: SiteProfile) -> list[Finding]:
    """What the site's MPI (mpi.flavour) cannot do with its profile or this job's launcher."""
    from .mpi_flavours import flavour

    mpi = profile.mpi
    out = [Finding("warning", key, why) for key, why in flavour(mpi.flavour).problems(job, profile)]
    if job.launcher == "srun" and mpi.srun_plugin() == "none" and job.world_size > 1:
        out.append(Finding("error", "mpi.srun_mpi", f"none: srun would start {job.world_size} "
                           "ranks that each see a world of one; use pmix or pmi2"))
    return out


def partition_findings(job: JobSpec, profile: SiteProfile) -> list[Finding]:
    """The job against the site profile's partitions (none: nothing to check)."""
    out: list[Finding] = []
    r = job.resources
    if profile.partitions:
        part = profile.partitions.get(r.partition or "")
        if r.partition is None:
            out.append(Finding("warning", "resources.partition",
                               "no partition set; Slurm uses its default partition"))
        elif part is None:
            out.append(Finding("error", "resources.partition",
                               f"unknown partition {r.partition!r}{close_match(r.partition, profile.partitions)}; "
                               f"partitions: {', '.join(sorted(profile.partitions))}"))
        if part is not None:
            cpus = r.tasks_per_node * r.cpus_per_task
            if part.cpus_per_node is not None and cpus > part.cpus_per_node:
                out.append(Finding("error", "resources.tasks_per_node",
                                   f"{r.tasks_per_node} ranks x {r.cpus_per_task} CPUs = {cpus} CPUs per "
                                   f"node, but partition {r.partition!r} has {part.cpus_per_node}"))
            if r.gpus_on_node > part.gpus_per_node:
                out.append(Finding("error", r.gpu_key,
                                   f"{count(r.gpus_on_node, 'GPU')} per node, but partition {r.partition!r} "
                                   f"has {part.gpus_per_node}"))
            if part.max_time and walltime_seconds(r.time) > walltime_seconds(part.max_time):
                out.append(Finding("error", "resources.time",
                                   f"{r.time} is longer than partition {r.partition!r} allows "
                                   f"({part.max_time})"))
    return out


def cluster_findings(job: JobSpec, part, names: list[str] | None = None) -> list[Finding]:
    """What Slurm's partition (a :class:`~hpcsuite.slurm.Partition`, or None when Slurm has no
    such partition) can never give this job: more nodes than it has or lets one job take, more
    CPUs or GPUs per node than its nodes have. Such a job would pend forever."""
    r = job.resources
    if part is None:
        where = repr(r.partition) if r.partition else "(the default partition)"
        return [Finding("error", "resources.partition",
                        f"Slurm has no partition {where}" +
                        (f"{close_match(r.partition, names)}; partitions: {', '.join(names)}"
                         if names and r.partition else ""))]
    out = []
    cpus = r.tasks_per_node * r.cpus_per_task
    fits = [n for n in part.nodes if n[0] >= cpus and n[1] >= r.gpus_on_node]
    most_cpus = max((n[0] for n in part.nodes), default=0)
    most_gpus = max((n[1] for n in part.nodes), default=0)
    if cpus > most_cpus:
        key = "resources.cpus_per_task" if r.cpus_per_task > 1 else "resources.tasks_per_node"
        out.append(Finding("error", key,
                           f"{r.tasks_per_node} ranks x {r.cpus_per_task} CPUs = {cpus} CPUs per "
                           f"node, but the nodes of partition {part.name!r} have at most "
                           f"{most_cpus}"))
    if r.gpus_on_node > most_gpus:
        out.append(Finding("error", r.gpu_key,
                           f"{count(r.gpus_on_node, 'GPU')} per node, but the nodes of partition "
                           f"{part.name!r} have at most {most_gpus}"))
    if out:
        return out
    if part.max_nodes is not None and r.nodes > part.max_nodes:
        out.append(Finding("error", "resources.nodes",
                           f"{count(r.nodes, 'node')}, but partition {part.name!r} lets one job have at "
                           f"most {part.max_nodes} (MaxNodes)"))
    elif r.nodes > len(fits):
        shape = f" with {cpus} CPUs" + (f" and {r.gpus_on_node} GPUs" if r.gpus_on_node else "")
        out.append(Finding("error", "resources.nodes",
                           f"{count(r.nodes, 'node')}, but partition {part.name!r} has "
                           f"{len(fits)} node{'s' if len(fits) != 1 else ''}{shape if len(fits) < len(part.nodes) else ''}"))
    return out


def slurm_findings(job: JobSpec) -> list[Finding]:
    """:func:`cluster_findings` against the Slurm that ``SLURM_CONF`` points to (two quick
    scontrol/sinfo calls); a Slurm that does not answer is a UserError."""
    from .. import slurm

    part = slurm.partition(job.resources.partition)
    return cluster_findings(job, part, slurm.partition_names() if part is None else None)


BUILD_TIMEOUT = 600.0


def build_findings(job: JobSpec, base: Path | None = None) -> list[Finding]:
    """What a rank would find at its start (data, model, loss: :mod:`.runtime.lint_build`),
    found now in one local process; it imports the job's framework, never this one."""
    import json
    import os
    import sys
    import tempfile

    from .. import slurm
    from ..runs.rundir import RunDir

    with tempfile.TemporaryDirectory(prefix="hpcsuite-build-") as tmp:
        path = RunDir(tmp).job           # where a rank finds it: $HPCSUITE_RUN_DIR
        path.write_text(json.dumps(job.to_dict()))
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", HPCSUITE_RUN_DIR=tmp)
        if os.geteuid() == 0:   # Open MPI refuses root unless told; no other account is told
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        # Through the one module that runs programs (argv, timeout: a hang is one line, exit 2).
        done = slurm.call([sys.executable, "-m", "hpcsuite.runtime.checks.lint_build", str(path)],
                          cwd=str(base or Path.cwd()), env=env, timeout=BUILD_TIMEOUT, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith('{"findings"'):
            return [Finding("error", key, message) for key, message in json.loads(line)["findings"]]
    detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return [Finding("error", "train.backend", f"--build: the check itself failed (exit "
                                              f"{done.returncode}): {detail}")]
