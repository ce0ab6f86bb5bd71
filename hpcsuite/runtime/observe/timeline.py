"""A Horovod timeline over a chosen window of steps (``train.monitor.timeline_steps``).

Horovod records a timeline only on its coordinator (rank 0), and recording a whole run makes
a file too large to open; so the window is recorded to rank 0's node-local disk (``$TMPDIR``,
no shared-filesystem traffic while it runs) and copied next to the results when it closes.
The template sets ``HOROVOD_TIMELINE=DYNAMIC``, which Horovod needs for ``start_timeline``.
Every rank calls :meth:`Window.step` (the start and stop calls are cheap on the others).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from ...runs.rundir import RunDir
from ...world import current

log = logging.getLogger(__name__)


class Window:
    def __init__(self, hvd, rank: int, run_dir: Path, start_step: int, steps: int):
        self.hvd, self.rank, self.run_dir = hvd, rank, Path(run_dir)
        # Steps are counted as done: the window records the steps that take the count from
        # ``first`` to ``last``; its file is horovod-timeline-steps-FIRST-LAST.json.
        self.first, self.last = start_step, start_step + steps
        job = current().job_id or str(os.getpid())
        self.local = Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / \
            f"hpcsuite-timeline-{os.getuid()}-{job}-{os.getpid()}.json"   # per user: one /tmp
        self.started_at: int | None = None
        self.done = False

    def step(self, step: int) -> None:
        """Call when ``step`` optimizer steps are done (the count over all attempts), before
        the next one runs."""
        if self.done:
            return
        if self.started_at is None and self.first <= step < self.last:
            self.hvd.start_timeline(str(self.local), mark_cycles=False)
            self.started_at = step
        elif self.started_at is not None and step >= self.last:
            self.close(step)

    def close(self, step: int) -> Path | None:
        """Stop recording after ``step`` steps (the window's end, or the end of training inside
        it) and copy rank 0's file to the run directory. Returns the copy on rank 0."""
        if self.done or self.started_at is None:
            self.done = True
            return None
        self.done = True
        self.hvd.stop_timeline()
        if self.rank != 0:
            return None
        target = RunDir(self.run_dir).timeline_window(self.started_at, step)
        try:
            shutil.copyfile(self.local, target)
            self.local.unlink()
        except OSError as e:
            log.warning("Horovod timeline of steps %d-%d not kept: %s", self.started_at, step, e)
            return None
        log.info("Horovod timeline of steps %d-%d: %s", self.started_at, step, target)
        return target
