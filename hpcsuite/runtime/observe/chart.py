"""The charts of a session: the one protocol the session writes them through (:class:`Chart`),
the pacing of training points every chart shares (:class:`Paced`), and :class:`Charts`, which
tells several charts every point. Two implement it: TensorBoard's event files
(:class:`.tensorboard.TensorBoard`) and MLflow's run (:class:`.tracking.Tracker`).

Training points (loss, learning rate, the throughput since the previous point) come at most
every :data:`CHART_SECONDS`; other points (validation, utilisation) when they happen. Rank 0
alone charts; a chart never stops training (one that cannot write says so once and is
``broken``)."""

from __future__ import annotations

import time
from typing import Protocol

CHART_SECONDS = 0.2      # training points at most this often (the ranks vote every ~0.25 s)


class Chart(Protocol):
    broken: bool                 # gave up: nothing more is written
    last_step: int | None        # the step of the last training point

    def due(self) -> bool:
        """A training point is due (:data:`CHART_SECONDS` since the last)."""

    def training(self, step: int, start_step: int, values: dict, step_times: list[float],
                 real: list[int]) -> None:
        """A training point at ``step``, with the throughput since the last one."""

    def add(self, step: int, start_step: int, values: dict) -> None:
        """Points at ``step`` (validation, utilisation: whenever they come)."""

    def flush(self) -> None:
        """What was added so far goes out soon (a checkpoint, a few seconds): never waits."""

    def close(self) -> None:
        """No more points come this attempt."""


class Paced:
    """The pacing of training points and their throughput, for a chart to build on: it writes
    :meth:`add`, and the rest of :class:`Chart`."""

    def __init__(self):
        self.broken = False
        self.at = float("-inf")         # when the last training point was added
        self.last_step: int | None = None   # its step
        self.counted = 0                # steps whose time and samples are in a point's rate

    def due(self) -> bool:
        return not self.broken and time.monotonic() - self.at >= CHART_SECONDS

    def training(self, step: int, start_step: int, values: dict, step_times: list[float],
                 real: list[int]) -> None:
        """A training point at ``step``: ``values`` and samples/s over the steps since the last
        point (``step_times`` and ``real`` hold one entry per step since ``start_step``)."""
        done = step - start_step
        times, samples = step_times[self.counted:done], real[self.counted:done]
        seconds = sum(times)
        # (no samples: a script that does not take its batches from run.batches())
        rate = sum(samples) / seconds if samples and seconds > 0 else None
        self.counted = max(self.counted, done)
        self.at, self.last_step = time.monotonic(), step
        self.add(step, start_step, {**values, "throughput/samples_per_s": rate})

    def add(self, step: int, start_step: int, values: dict) -> None:
        raise NotImplementedError


class Charts:
    """Rank 0's charts (TensorBoard's, MLflow's), each told every point: the session's one
    chart, whatever it writes to."""

    def __init__(self, charts: list[Chart]):
        self.charts = charts

    @classmethod
    def of(cls, *charts: Chart | None):
        """None, the one chart, or both."""
        kept = [c for c in charts if c is not None]
        return None if not kept else kept[0] if len(kept) == 1 else cls(kept)

    @property
    def last_step(self) -> int | None:
        working = [c.last_step for c in self.charts if not c.broken]
        return working[0] if working else None

    def due(self) -> bool:
        return any(c.due() for c in self.charts)

    def training(self, *args) -> None:
        for c in self.charts:
            c.training(*args)

    def add(self, *args) -> None:
        for c in self.charts:
            c.add(*args)

    def flush(self) -> None:
        for c in self.charts:
            c.flush()

    def close(self) -> None:
        for c in self.charts:
            c.close()
