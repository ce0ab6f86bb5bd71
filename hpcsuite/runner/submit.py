"""The one way a job reaches Slurm: a plain job, a study's point and a sweep's job array all
go through :func:`submit`, with the same checks before sbatch (the checkpoint directory) and
the same record after (the run registry; a failure to record never hides the job id)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from pathlib import Path

from ..errors import UserError
from ..records import Record, record
from ..runs import rundir
from ..submit.plan import BatchRequest


def _log():
    """This module's logger, imported when first needed: logging alone adds ~3 ms to render
    and submit --dry-run, which import this module but never log."""
    import logging

    return logging.getLogger(__name__)


@record
class Submitted(Record):
    """A job sbatch accepted: its id, run directory and script."""
    job_id: str
    run_dir: str                      # a job array's: the run root its elements' runs go in
    script_path: str


SBATCH_TIMEOUT_S = 300


def sbatch(request: BatchRequest, staged: Path) -> str:
    """Write the script to ``staged``, call sbatch on it from the work directory (SBATCH_*
    stripped from the environment), and return the job id; the file is removed if sbatch fails."""
    from .. import slurm

    staged.write_text(request.script)
    try:
        # A busy controller (fifty submits at once on a loaded machine, seen in CI) can keep
        # sbatch a minute or more; a timeout here may leave a job submitted without its id.
        done = slurm.call([*request.sbatch_argv, str(staged)], cwd=request.workdir,
                          env=slurm.slurm_env(git_env(request), strip_sbatch=True),
                          timeout=SBATCH_TIMEOUT_S)
        return slurm.parse_sbatch_parsable(done.stdout)
    except slurm.TimedOut as e:
        staged.unlink(missing_ok=True)
        raise UserError(f"{e} (the controller is busy; the job may have been submitted "
                        "all the same: check squeue before submitting again)") from None
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def git_env(request: BatchRequest) -> dict[str, str]:
    """For a job that tracks with MLflow: the commit of the work directory's git tree and
    whether it had changes, as they are now, for the job's environment (sbatch exports it, a
    requeue keeps it): the ranks tag the run with the commit submitted, not whatever the
    tree holds when the job starts."""
    if request.job.train.tracking is None:
        return {}
    from ..runs.mlflow_store import GIT_COMMIT, GIT_DIRTY
    from ..runs.registry import git_state

    git = git_state(request.workdir)
    return {GIT_COMMIT: git["commit"] or "",
            GIT_DIRTY: "" if git["dirty"] is None else str(git["dirty"]).lower()}


def held(request: BatchRequest) -> BatchRequest:
    """The request submitted held: it starts after ``scontrol release JOBID``."""
    if "--hold" in request.sbatch_argv:
        return request
    return dataclasses.replace(request, sbatch_argv=[*request.sbatch_argv, "--hold"])


def submit(request: BatchRequest, hold: bool = False, *, jobs: list | None = None,
           sweep=None, indices: list[int] = (), waits_for: list[str] = ()) -> Submitted:
    """Refuse before sbatch what would go wrong in the job (a checkpoint directory another
    live job writes, or one whose run has finished), then write the script, call sbatch and
    record what was submitted.

    A job array (``request.array``, a sweep's) gives ``sweep``, its sweep directory
    (:class:`hpcsuite.sweep.sweepdir.SweepDir`), which keeps the script and the submission;
    ``jobs``: each element's job, each checked like a plain job; ``indices``: the elements it
    runs; ``waits_for``: the jobs its ``--dependency`` (already in its sbatch argv) names."""
    from ..runs.ownership import check_before_submit

    for job in [request.job] if jobs is None else jobs:
        check_before_submit(job, request.workdir)
    request = held(request) if hold else request
    if request.array is None:
        return _submit_job(request)
    return _submit_array(request, sweep, list(indices), list(waits_for))


def _recorded(write, what: str, job_id: str, where: str = "", doing: str = "record it") -> bool:
    """Run ``write``, which records a submitted job: the job is in Slurm's hands now, so a
    failure to record it (a full or over-quota disk) must not hide its id (a warning says
    both). Whether it was written."""
    try:
        write()
    except OSError as e:
        _log().warning("submitted %s %s, but could not %s%s: %s", what, job_id, doing, where,
                       e.strerror or e)
        return False
    return True


def _submit_job(request: BatchRequest) -> Submitted:
    """sbatch one job; its run directory keeps the script, submit.json and profile.json."""
    from ..runs import registry

    root = rundir.RunRoot(Path(request.workdir) / request.run_root)
    root.path.mkdir(parents=True, exist_ok=True)
    staged = root.staged_script(dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f"))
    job_id = sbatch(request, staged)
    # From here on the job is Slurm's: every write warns when it fails, none hides the id.
    run = root.run(job_id)

    def keep_script() -> None:
        run.path.mkdir(parents=True, exist_ok=True)
        os.replace(staged, run.script)

    kept = _recorded(keep_script, "job", job_id,
                     doing=f"move its script into {run.path} (it stays at {staged})")
    script_path = run.script if kept else staged

    def write_run_dir() -> None:
        run.submit.write_text(json.dumps({
            "job_id": job_id, "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
            "workdir": request.workdir, "template": request.template, "spec": request.spec,
            "sbatch_argv": [*request.sbatch_argv, str(script_path)],
        }, indent=2) + "\n")
        run.profile.write_text(json.dumps(request.profile, indent=2, sort_keys=True) + "\n")

    if kept:
        _recorded(write_run_dir, "job", job_id, f" in {run.path}")

    def write() -> None:
        registry.record(request.workdir, {
            "job_id": job_id, "name": request.job.name, "run_dir": str(run.path),
            "spec": request.spec, "spec_digest": request.job.digest(),
            "template": request.template, "script": str(script_path),
            "git": registry.git_state(request.workdir)})

    _recorded(write, "job", job_id, f" in {registry.path_in(request.workdir)}")
    _log().info("submitted job %s, run directory %s", job_id, run.path)
    return Submitted(job_id=job_id, run_dir=str(run.path), script_path=str(script_path))


def _submit_array(request: BatchRequest, sd, indices: list[int],
                  waits_for: list[str]) -> Submitted:
    """sbatch a sweep's job array; the sweep directory keeps its script and submission."""
    from ..runs import registry

    workdir = Path(request.workdir)
    root = rundir.RunRoot(workdir / request.run_root)
    root.path.mkdir(parents=True, exist_ok=True)      # Slurm's logs
    staged = sd.staged_script()
    staged.parent.mkdir(exist_ok=True)
    job_id = sbatch(request, staged)
    # From here on the array is Slurm's: every write warns when it fails, none hides the id.
    script = sd.script(job_id)
    if not _recorded(lambda: os.replace(staged, script), "job array", job_id,
                     doing=f"move its script to {script} (it stays at {staged})"):
        script = staged
    entry = {"array_job_id": job_id, "indices": indices, "array": request.array.spec,
             "script": str(script), "sbatch_argv": [*request.sbatch_argv, str(script)],
             "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
             **({"waits_for": waits_for} if waits_for else {})}

    _recorded(lambda: sd.record_submission(entry), "job array", job_id, f" in {sd.path}")

    def write() -> None:
        registry.record(workdir, {
            "job_id": job_id, "name": request.job.name, "run_dir": str(root.path),
            "spec": request.spec, "spec_digest": request.array.digest,
            "template": request.template, "script": str(script),
            "git": registry.git_state(workdir),
            "array": {"sweep": sd.definition()["name"], "sweep_dir": str(sd.path),
                      "indices": indices}})

    _recorded(write, "job array", job_id, f" in {registry.path_in(workdir)}")
    return Submitted(job_id=job_id, run_dir=str(root.path), script_path=str(script))
