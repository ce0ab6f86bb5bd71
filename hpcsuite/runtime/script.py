"""Script mode: run the user's own training script on this rank, as `python SCRIPT ARGS` would.

``hpcsuite train`` comes here when the job has ``train.script``: the preemption signals are
already caught (so a signal during the script's imports is remembered, not fatal), the script
finds the job through ``HPCSUITE_JOB``/``HPCSUITE_RUN_DIR`` (see :mod:`.script_job`), and a
run the script left open is finished for it.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from ..errors import UserError
from ..runs.rundir import RunDir
from ..submit.spec import JobSpec


def run_script(job: JobSpec, run_dir: Path) -> None:
    from .. import usercode
    from .script_run import active

    script = Path(job.train.script)
    if not script.is_file():
        raise UserError(f"train.script: {script}: no such file (in {Path.cwd()})")
    os.environ.setdefault("HPCSUITE_JOB", str(RunDir(run_dir).job))
    os.environ.setdefault("HPCSUITE_RUN_DIR", str(run_dir))
    dirs = usercode.search_dirs(job.train.pythonpath)
    sys.path[:0] = [str(script.parent.absolute()), *(str(d) for d in dirs[1:])]
    sys.argv = [str(script), *job.train.args]
    runpy.run_path(str(script), run_name="__main__")
    run = active()
    if run is not None:
        run.finish()
