"""Which job script mode's :class:`~.script_run.Run` belongs to, and its run directory: the
one hpcsuite launched this rank in, or outside Slurm a spec resolved and run in this process.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from ...errors import UserError
from ...world import from_env
from ...runs.results import write_json_atomic
from ...runs.rundir import RunDir, RunRoot
from ...submit.spec import JobSpec
from ..rank.job_io import load_job
from ..rank.startup import OFF

log = logging.getLogger("hpcsuite.api")   # the name users' log lines have always shown


class Handover:
    """What ``hpcsuite train`` hands the :class:`~.script_run.Run` the user's script makes in
    this process: the rank's startup watch. The script builds its Run itself, so this is the one
    hand-over that cannot be an argument; it holds only while :func:`handed` runs the script
    (:func:`~.script.run_script`), and is the null watch otherwise (a script run by hand)."""
    watch = OFF


@contextmanager
def handed(watch):
    Handover.watch = watch
    try:
        yield
    finally:
        Handover.watch = OFF


def refuse_ranks_without_horovod(env=os.environ) -> None:
    """Run() without ``hvd`` is one process: in a launch of several ranks each would train
    alone and write the same checkpoints and results.json. One line and exit 2 instead."""
    world = from_env(env)
    if world.size > 1:
        print(f"error: hpcsuite.api.Run(): rank {world.rank} of {world.size} ranks the launcher started, "
              f"but no Horovod module was given: call hvd.init() and pass it, api.Run(hvd) "
              f"(without it every rank would train alone and write the same checkpoints)",
              file=sys.stderr, flush=True)
        raise SystemExit(UserError.exit_code)


def find_job(hvd, job: JobSpec | None, run_dir, spec) -> tuple[JobSpec, Path]:
    """The job this rank runs and its run directory (see :class:`~.script_run.Run`)."""
    run_dir = run_dir or os.environ.get("HPCSUITE_RUN_DIR")
    if job is not None:
        return job, Path(run_dir or ".").absolute()
    named = os.environ.get("HPCSUITE_JOB")
    if named:
        return load_job(named), Path(run_dir or Path(named).parent).absolute()
    if run_dir:
        return load_job(str(RunDir(run_dir).job)), Path(run_dir).absolute()
    spec = spec or os.environ.get("HPCSUITE_SPEC")
    if not spec and RunDir(".").job.is_file():
        return load_job(str(RunDir(".").job)), Path(".").absolute()
    try:
        if not spec:
            script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "train.py"
            raise UserError(
                f"hpcsuite.api.Run: not inside an hpcsuite job (no HPCSUITE_JOB, no job.json "
                f"in {Path.cwd()}): submit it with `hpcsuite submit SPEC.yaml` (train.script: "
                f"{script}), or try it here in one process with `HPCSUITE_SPEC=SPEC.yaml python "
                f"{script}` (or api.Run(hvd, spec='SPEC.yaml'))")
        return local_job(hvd, str(spec))
    except UserError as e:        # the script runs by hand: its user gets one line, no traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(UserError.exit_code) from None


def local_job(hvd, spec: str) -> tuple[JobSpec, Path]:
    """``spec`` resolved as ``hpcsuite submit`` would (profiles, locks), run in this process:
    a run directory of its own under OUTPUT_DIR/NAME/local/, with the resolved job.json."""
    import datetime as dt

    from ...submit.config import resolve

    if not Path(spec).is_file():
        raise UserError(f"{spec}: no such file (HPCSUITE_SPEC or api.Run(spec=...): the job spec "
                        "to try this script with)")
    job = resolve(spec).job
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    stamp = hvd.broadcast_object(stamp, root_rank=0, name="hpcsuite.api.local")
    run_dir = RunRoot.of(job.output_dir, job.name).local(stamp).path.absolute()
    if int(hvd.rank()) == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(RunDir(run_dir).job, job.to_dict())
        log.warning("not in a Slurm job: running %s in this process (%d rank%s), outputs in %s",
                    spec, int(hvd.size()), "s" if int(hvd.size()) != 1 else "", run_dir)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
    return job, run_dir
