"""Planning is pure: (job spec, site profile, templates) -> BatchRequest. Submitting acts."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .launchers import LaunchContext, get_launcher
from .profile import SiteProfile
from .shell import Raw, join
from .spec import JobSpec
from .templating import SearchPath, render

log = logging.getLogger(__name__)

# Horovod reads these at hvd.init(); the template exports them for every rank.
def horovod_environment(job: JobSpec) -> dict[str, str]:
    h = job.train.horovod
    env = {
        "HOROVOD_FUSION_THRESHOLD": str(h.fusion_threshold_mb * 1024 * 1024),
        "HOROVOD_CYCLE_TIME": f"{h.cycle_time_ms:g}",
    }
    if h.stall_check_seconds:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(h.stall_check_seconds)
    else:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    if h.stall_shutdown_seconds:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(h.stall_shutdown_seconds)
    if h.timeline:
        env["HOROVOD_TIMELINE"] = Raw('"$RUN_DIR/horovod-timeline.json"')
    if h.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
        env["HOROVOD_AUTOTUNE_LOG"] = Raw('"$RUN_DIR/horovod-autotune.csv"')
    return env


@dataclass(frozen=True)
class BatchRequest:
    """Everything `submit` needs; its repr is the script, so --dry-run shows the truth."""

    job: JobSpec
    script: str
    sbatch_argv: list[str]
    run_root: str                     # runs/<name>, relative to the submit directory
    template: str                     # the template file that rendered the script
    workdir: str = field(default_factory=os.getcwd)

    def __repr__(self) -> str:
        return self.script

    def to_json(self) -> dict:
        return {"job": self.job.name, "script": self.script, "sbatch_argv": self.sbatch_argv,
                "run_root": self.run_root, "template": self.template, "workdir": self.workdir}


def plan(job: JobSpec, profile: SiteProfile, path: SearchPath) -> BatchRequest:
    environment = {**horovod_environment(job), **job.env}
    command = [profile.interpreter(), "-m", "hpcsuite", "train", "--job", Raw('"$RUN_DIR/job.json"')]
    ctx = LaunchContext(job=job, mpi=profile.mpi, command=tuple(command),
                        env_names=("PATH", "HPCSUITE_RUN_DIR", *environment))
    launch = join(get_launcher(job.launcher).argv(ctx))
    run_root = f"{job.output_dir.rstrip('/')}/{job.name}"
    template_file = path.which(job.template)
    partition = profile.partitions.get(job.resources.partition or "")
    context = {
        "job": job,
        "site": profile,
        "partition": partition,
        "version": __version__,
        "template_name": job.template,
        "digest": job.digest(),
        "paths": {"run_root": run_root, "log": f"{run_root}/slurm-%j.out"},
        "module_init": Raw(profile.module_init) if profile.module_init else None,
        "module_paths": list(profile.module_paths),
        "modules": list(profile.modules),
        "setup": [Raw(line) for line in profile.setup],
        "environment": environment,
        "job_json": Raw(json.dumps(job.to_dict(), sort_keys=True, ensure_ascii=True)),
        "launch": launch,
        "preemption": job.train.preemption,
        # Catch signals in the batch shell whenever a checkpoint could be saved on them.
        "forward_signals": job.train.checkpoint.enabled,
    }
    script = render(path, job.template, context)
    return BatchRequest(job=job, script=script, sbatch_argv=["sbatch", "--parsable"],
                        run_root=run_root, template=str(template_file))


@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: str
    script_path: str


def submit(request: BatchRequest) -> Submitted:
    """Write the script, call sbatch from the work directory, record what was submitted."""
    from . import slurm
    root = Path(request.workdir) / request.run_root
    root.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    staged = root / f".submit-{stamp}.sbatch"
    staged.write_text(request.script)
    try:
        done = slurm.call([*request.sbatch_argv, str(staged)], cwd=request.workdir,
                          env=slurm.slurm_env(strip_sbatch=True), timeout=60)
        job_id = slurm.parse_sbatch_parsable(done.stdout)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    run_dir = root / job_id
    run_dir.mkdir(parents=True, exist_ok=True)
    script_path = run_dir / "job.sbatch"
    os.replace(staged, script_path)
    (run_dir / "submit.json").write_text(json.dumps({
        "job_id": job_id, "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
        "workdir": request.workdir, "template": request.template,
        "sbatch_argv": [*request.sbatch_argv, str(script_path)],
    }, indent=2) + "\n")
    log.info("submitted job %s, run directory %s", job_id, run_dir)
    return Submitted(job_id=job_id, run_dir=str(run_dir), script_path=str(script_path))
