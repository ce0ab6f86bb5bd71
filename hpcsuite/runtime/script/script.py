"""Script mode: run the user's own training script on this rank, as `python SCRIPT ARGS` would.

``hpcsuite train`` comes here when the job has ``train.script``: the preemption signals are
already caught (so a signal during the script's imports is remembered, not fatal), the script
finds the job through ``HPCSUITE_JOB``/``HPCSUITE_RUN_DIR`` (see :mod:`.script_job`), and a
run the script left open is finished for it.
"""

from __future__ import annotations

import functools
import logging
import os
import runpy
import sys
from pathlib import Path

from ...errors import UserError
from ...runs.rundir import RunDir
from ...submit.spec import JobSpec
from ..rank.startup import OFF

log = logging.getLogger(__name__)


def run_script(job: JobSpec, run_dir: Path, watch=OFF) -> None:
    """Run ``train.script`` in this process; the Run it makes is handed ``watch``."""
    from ... import usercode
    from .script_job import handed
    from .script_run import active

    script = Path(job.train.script)
    if not script.is_file():
        raise UserError(f"train.script: {script}: no such file (in {Path.cwd()})")
    os.environ.setdefault("HPCSUITE_JOB", str(RunDir(run_dir).job))
    os.environ.setdefault("HPCSUITE_RUN_DIR", str(run_dir))
    dirs = usercode.search_dirs(job.train.pythonpath)
    sys.path[:0] = [str(script.parent.absolute()), *(str(d) for d in dirs[1:])]
    sys.argv = [str(script), *job.train.args]
    horovod = watch_horovod_init(run_dir)
    try:
        with handed(watch):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:      # sys.exit(0) at the end is a script that returned
        if e.code not in (None, 0):
            raise
    run = active()
    if run is not None:
        run.finish()
    say_how_it_ran(run_dir, run is not None, horovod)


def watch_horovod_init(run_dir: Path | None = None) -> dict:
    """{"size": N} once the script's ``hvd.init()`` has run (any framework's: they share
    Horovod's basics), before any ``hvd.shutdown()`` can hide it. Empty when Horovod is not
    installed (then nothing can initialise it). Before the init, the MPI library the script's
    Horovod loaded must be the profile's mpi.flavour (:mod:`hpcsuite.runtime.frameworks.horovod_mpi`)."""
    seen: dict = {}
    try:
        from horovod.common.basics import HorovodBasics
    except ImportError:
        return seen
    original = HorovodBasics.init

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        from ..frameworks.horovod_mpi import check

        check(str(run_dir) if run_dir else None)
        done = original(self, *args, **kwargs)
        try:
            seen["size"] = int(self.size())
        except Exception:  # noqa: BLE001 - a failed init raised already; this only records
            pass
        return done

    HorovodBasics.init = init
    return seen


def say_how_it_ran(run_dir: Path, api: bool, horovod: dict) -> None:
    """This rank's word (:mod:`~hpcsuite.runs.script_ranks`): whether the script used
    hpcsuite.api and the world it ran in; a warning when it trained alone among several."""
    from ...runs.attempts import attempt_number
    from ...runs.results import write_json_atomic
    from ...runs.script_ranks import alone, word
    from ...world import current

    me = current()
    said = word(me.rank, me.size, api, horovod.get("size") or _horovod_size(), _mpi_size())
    if alone(said):
        log.warning("rank %d of %d never joined a Horovod world (the script never called "
                    "hvd.init()): it trained alone as a world of one", me.rank, me.size)
    path = RunDir(run_dir).script_word(attempt_number(), me.rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, said)
    except OSError as e:
        log.warning("%s not written: %s", path, e.strerror)


def _horovod_size() -> int | None:
    """The world of an initialised Horovod the script imported (when the init was not seen)."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras",
                 "horovod.tensorflow.keras"):
        module = sys.modules.get(name)
        try:
            if module is not None and module.is_initialized():
                return int(module.size())
        except Exception:  # noqa: BLE001 - an older Horovod without is_initialized
            continue
    return None


def _mpi_size() -> int | None:
    """MPI's world, when the script used mpi4py itself (it may exchange gradients so)."""
    module = sys.modules.get("mpi4py.MPI")
    try:
        if module is not None and module.Is_initialized() and not module.Is_finalized():
            return int(module.COMM_WORLD.Get_size())
    except Exception:  # noqa: BLE001 - only a record
        pass
    return None
