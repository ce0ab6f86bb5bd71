"""TensorBoard event files of a run (``train.monitor.tensorboard``), written by rank 0.

One log directory per run, the run directory's ``tensorboard/``, and one event file per attempt
in it: TensorBoard reads a directory's files in name order (the time comes first in the name),
so a requeued job shows as one run that continues, its steps the job's optimizer steps. Each
attempt opens its file with a ``SessionLog.START`` at the first step it trains: TensorBoard
then drops what an earlier attempt wrote past the checkpoint this one resumed from (the steps
of an attempt that crashed after its last save, which this attempt trains again).

The records are TensorBoard's own (its ``Event``/``Summary`` protos and ``RecordWriter``: the
TFRecord framing with its checksums), written to a plain buffered file. Not its
``EventFileWriter``: that goes through ``tf.io.gfile``, which imports TensorFlow whenever it
is installed, seconds and hundreds of MB in a PyTorch rank, and it runs a thread of its own.

What it costs: about 18 us to add a point (a few scalars; most of it the checksum in pure
Python), so the session adds training points at most every :data:`.chart.CHART_SECONDS`, not every
step; the file is flushed (a ``write``, no ``fsync``) at most every :data:`FLUSH_SECONDS`, at a
checkpoint, and closed (with an ``fsync``) when the attempt reports, stopped early or not.
A crash loses at most the last few seconds' points, which the next attempt trains again.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ...runs.rundir import RunDir
from .chart import Paced

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0      # buffered points reach the file at least this often


class EventLog:
    """One attempt's event file: scalars by tag at a step."""

    def __init__(self, run_dir: Path, start_step: int, host: str):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = Event, Summary
        self.path = RunDir(run_dir).tensorboard_events(time.time(), host, os.getpid())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab", buffering=1 << 16)
        self._records = RecordWriter(self._file)
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self._write(Event(wall_time=time.time(), step=start_step + 1,
                          session_log=SessionLog(status=SessionLog.START)))
        self.flush()

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """One event at ``step`` with a scalar per tag (None: left out). TensorBoard's scalars
        are float32 (``simple_value``)."""
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(v))
                                       for tag, v in values.items() if v is not None])
        self._write(self._event(wall_time=time.time(), step=int(step), summary=summary))
        if time.monotonic() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self._file.flush()
        self.flushed_at = time.monotonic()

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class TensorBoard(Paced):
    """Rank 0's TensorBoard chart of a session (:class:`.chart.Chart`). Writing never stops
    training: a file that cannot be written is said once and given up."""

    def __init__(self, run_dir: Path, host: str):
        super().__init__()
        self.run_dir, self.host = Path(run_dir), host
        self.events: EventLog | None = None

    def add(self, step: int, start_step: int, values: dict) -> None:
        if self.broken:
            return
        try:
            if self.events is None:
                self.events = EventLog(self.run_dir, start_step, self.host)
                log.info("TensorBoard: %s", self.events.path.parent)
            self.events.scalars(step, values)
        except OSError as e:
            self.give_up(e)

    def flush(self) -> None:
        if self.events is not None and not self.broken:
            try:
                self.events.flush()
            except OSError as e:
                self.give_up(e)

    def close(self) -> None:
        if self.events is not None and not self.broken:
            try:
                self.events.close()
            except OSError as e:
                self.give_up(e)

    def give_up(self, e: OSError) -> None:
        log.warning("train.monitor.tensorboard: cannot write %s (%s); no more TensorBoard "
                    "points this attempt", RunDir(self.run_dir).tensorboard, e.strerror or e)
        self.broken = True


def utilisation_values(rank: int, sample: dict) -> dict[str, float]:
    """A :mod:`.monitor` sample as scalars, by tag (memory in MiB)."""
    prefix = f"utilisation/rank{rank}/"
    out = {prefix + "cpu_percent": sample.get("cpu_percent"),
           prefix + "memory_mib": sample.get("rss_bytes", 0) / 2 ** 20}
    if "gpu_percent" in sample:
        out[prefix + "gpu_percent"] = sample["gpu_percent"]
        out[prefix + "gpu_memory_mib"] = sample.get("gpu_memory_bytes", 0) / 2 ** 20
    return out


def own_time_values(own: tuple) -> dict[str, float]:
    """Every rank's own work per step at a vote (:mod:`hpcsuite.runs.stragglers`), in ms, by
    tag; the ranks whose time is not measured are left out."""
    return {f"ranks/own_ms/rank_{r}": 1e3 * t for r, t in enumerate(own) if t is not None}
