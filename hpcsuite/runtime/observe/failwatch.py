"""End this rank as soon as another rank of the attempt has reported its failure.

A rank that raises writes ``FAILED-attempt-N`` (:func:`hpcsuite.runtime.train.fail`) and
exits. The others are then waiting in an allreduce that will never complete: a signal handler
of theirs does not run (the main thread is inside Horovod's C code), so before this watch they
waited for the launcher's kill: mpirun's SIGTERM, which they catch to save a checkpoint, then
its SIGKILL ``odls_base_sigkill_timeout`` seconds later (10: the time a save after Slurm's own
TERM needs); under srun Slurm's KillWait. Nothing is left to save after a failure, so a daemon
thread in each rank looks for the marker and ends the rank at once, with the status the failed
rank exits with (the launcher's status is then the same whichever rank it sees first).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable

from ...runs.rundir import RunDir, failure_exit

log = logging.getLogger(__name__)

TICK = 1.0         # seconds between looks: one stat of one file a second per rank (a
                   # shared filesystem's metadata server takes every rank's)
UNREADABLE = 3     # looks at a marker not yet written in full before ending anyway


def failed_rank(marker: Path) -> int | None:
    """The rank that wrote ``marker`` (its first line, ``rank R``), None until it says."""
    try:
        first = marker.read_text(errors="replace").split("\n", 1)[0].split()
    except OSError:
        return None
    return int(first[1]) if len(first) == 2 and first[0] == "rank" and first[1].isdigit() else None


def check(marker: Path, rank: int, looks: int) -> int | None:
    """The status to end this rank with, or None to go on: another rank's marker exists (once
    it says which rank wrote it, or after ``UNREADABLE`` looks at it)."""
    if not marker.is_file():
        return None
    writer = failed_rank(marker)
    if writer == rank or (writer is None and looks < UNREADABLE):
        return None          # this rank's own report (it exits itself), or still being written
    return failure_exit(marker) or 1


def end_rank(status: int, marker: Path | None = None) -> None:
    """End this rank now with ``status``; its Prometheus textfile says it ended first."""
    from .monitor import end_all

    end_all("failed")
    os._exit(status)


def watch(run_dir: Path, rank: int, attempt: int,
          end: Callable[..., None] = end_rank,
          stop: threading.Event | None = None) -> threading.Thread:
    """Start the watch for attempt ``attempt``; ``end(status)`` ends the rank (tests pass
    their own); ``stop`` ends the watch (training is over)."""
    marker = RunDir(run_dir).failed(attempt)
    stop = stop or threading.Event()

    def run() -> None:
        looks = 0
        while not stop.wait(TICK):
            if not marker.is_file():       # the one stat a second, mostly of no file
                continue
            looks += 1
            status = check(marker, rank, looks)
            if status is not None:
                writer = failed_rank(marker)
                log.info("rank %s failed (%s): this rank ends now",
                         writer if writer is not None else "?", marker.name)
                end(status, marker)
                return

    thread = threading.Thread(target=run, name="hpcsuite-failure-watch", daemon=True)
    thread.start()
    return thread
