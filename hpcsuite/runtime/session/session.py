"""One training session, whichever mode calls the steps: how a run restores, votes, saves,
watches the clock, keeps its progress and reports.

The managed loop (:class:`.loop.Trainer`) and script mode (:class:`hpcsuite.api.Run`) differ in
who calls the step, not in any of that, so both are thin adapters over a :class:`Session`:

- the checkpoint store and what every manifest records (the step, the data cursor, the world);
- the :class:`~.policy.Policy` (when to vote, save, log) and the stop: the preemption flag, rank
  0's time-limit watch, the reason, the step it was first asked for;
- the ranks' vote (:mod:`hpcsuite.runtime.rank.vote`): posted with :meth:`Session.post_vote`, read with
  :meth:`Session.read_vote`, so a fix to either reaches both modes;
- :class:`Progress` (step, cursor), :class:`Metrics`, progress.json and results.json;
- rank 0's charts: TensorBoard's (:mod:`hpcsuite.runtime.observe.tensorboard`, ``train.monitor.tensorboard``) and
  MLflow's (:mod:`hpcsuite.runtime.observe.tracking`, ``train.tracking``), told the same points through one chart.

The ranks talk through :class:`~hpcsuite.runtime.frameworks.protocol.Collectives`, four calls: the Horovod backends implement it on
their own tensors, script mode over the script's ``hvd`` module (:mod:`hpcsuite.runtime.script.collectives`), tests
with threads. Framework-free: nothing here imports torch, TensorFlow or Horovod.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...runs.attempts import SAVED, UNSAVED, attempt_number, checkpoint_root
from ...errors import UserError
from ...runs.results import Results, step_stats, write_progress
from ...runs.rundir import RunDir
from ...runs.world_change import change as world_change_of, in_words as world_change_in_words
from ...submit.spec import JobSpec
from ..rank import vote
from ..rank.startup import OFF
from ..frameworks.protocol import Collectives
from .checkpoint import CheckpointStore, Loaded
from ..rank.job_io import hostname, job_id
from .policy import PROGRESS_SECONDS, VOTE_SECONDS, Policy, steady_throughput
from ..input.sharding import Cursor
from ..rank.signals import FLAG, StopFlag
from ..observe.chart import Charts
from ..observe.tensorboard import TensorBoard
from ..observe.tracking import Tracker

log = logging.getLogger(__name__)




@dataclass
class Progress:
    step: int = 0                    # optimizer steps done, including resumed ones
    cursor: Cursor = field(default_factory=Cursor)
    start_step: int = 0
    resumed_from: str | None = None


@dataclass
class Metrics:
    """What one rank records while training (each mode fills the parts it has)."""
    step_times: list[float] = field(default_factory=list)
    data_times: list[float] = field(default_factory=list)
    loss_sums: list[float] = field(default_factory=list)  # per step: its micro-batches' sum
    # The micro-batches' loss sums as the backend returned them (tensors), not yet in loss_sums:
    # turned into floats in one call per vote instead of one device read per step.
    pending: list = field(default_factory=list)
    real: list[int] = field(default_factory=list)         # per step: real samples, all ranks
    lr: list[float] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)   # script mode's run.log()
    samples: int = 0


@dataclass(frozen=True)
class RankCharts:
    """Rank 0's charts: TensorBoard's event files and MLflow's run. The mode that makes a
    :class:`Session` opens them (:meth:`open`, which starts the MLflow thread) and hands them
    over; a session made without them charts nothing."""
    board: TensorBoard | None = None
    tracker: Tracker | None = None

    @classmethod
    def open(cls, job: JobSpec, run_dir: Path, rank: int) -> "RankCharts":
        """What the spec asks (``train.monitor.tensorboard``, ``train.tracking``) on rank 0."""
        if rank != 0:
            return cls()
        t = job.train
        board = TensorBoard(Path(run_dir), hostname()) if t.monitor.tensorboard else None
        tracker = Tracker(job, Path(run_dir), hostname()).start() if t.tracking is not None else None
        return cls(board, tracker)


class Session:
    """One rank's part of a training run (see the module's doc). ``watch`` is the rank's
    startup watch (:mod:`hpcsuite.runtime.rank.startup`), ``charts`` rank 0's charts."""

    def __init__(self, job: JobSpec, run_dir: Path, ranks: Collectives, flag: StopFlag = FLAG,
                 watch=OFF, charts: RankCharts = RankCharts()):
        self.job, self.train, self.ranks, self.flag = job, job.train, ranks, flag
        self.watch = watch
        self.run_dir = Path(run_dir)
        self.rank, self.size = int(ranks.rank), int(ranks.size)
        self.store = CheckpointStore(checkpoint_root(job, self.run_dir), self.train.checkpoint.keep)
        self.progress = Progress()
        self.metrics = Metrics()
        self.policy = Policy(job, 0, time.monotonic())
        self.progress_at = float("-inf")
        self.stopped = False
        self.stop_reason = "preempted"     # rank 0's word when the stop is agreed
        self.noticed_step: int | None = None   # the vote step a stop was first asked for here
        self.saved_step: int | None = None     # the step of the latest save
        self.vote_handle = None                # a vote posted and not yet read
        self.vote_tick = 0                     # the tick (a step, a call) it was posted at
        self.time_limit = None                 # rank 0 stops before Slurm's time limit
        self.world_change: dict | None = None  # rank 0: resumed on another number of ranks
        self.tracker = charts.tracker
        self.chart = Charts.of(charts.board, charts.tracker)
        if self.rank == 0 and self.train.preemption.watches_time_limit(self.train.checkpoint.enabled):
            from .timelimit import TimeLimit

            self.time_limit = TimeLimit.from_slurm()
        watch.follow(self.has_stepped)       # Horovod is up: the watch waits for a step

    def has_stepped(self) -> bool:
        """Whether this rank has trained a step in this attempt (the startup watch asks, from
        its thread): the managed loop times each step it ends; a script logs a step
        (run.log), votes after one (run.should_stop) or asks for a second step's batches."""
        p = self.progress
        return bool(self.metrics.step_times) or self.vote_tick > 0 or p.step > p.start_step + 1

    # ---------------------------------------------------------------- resume
    def restore(self, accept: Callable[[Loaded], None]) -> Loaded | None:
        """The latest good checkpoint (collective). Rank 0 picks it and ``accept`` checks it
        (and may load it; a UserError refuses it); every rank learns its step, cursor and path
        and continues from there. Returns what rank 0 read; None on the other ranks, or when
        there is nothing to resume."""
        with self.watch.paused():   # a large checkpoint may take long: not a hang
            info, loaded = self._pick(accept)
        if info is not None and "error" in info:
            raise UserError(info["error"])
        if info is None:
            return None
        step = int(info["step"])
        self.progress = Progress(step, Cursor.from_json(info["cursor"]), step, info["path"])
        self.policy = Policy(self.job, step, time.monotonic())
        if loaded is not None:      # rank 0 says what a change of world size means
            self.world_change = world_change_of(loaded.manifest, self.train.batch_size,
                                                self.train.grad_accumulation, self.size, step,
                                                self.train.max_steps)
            if self.world_change:
                log.warning("%s", world_change_in_words(self.world_change))
        return loaded

    def _pick(self, accept: Callable[[Loaded], None]) -> tuple[dict | None, Loaded | None]:
        """Rank 0's pick, on every rank: its step, cursor and path, or its error."""
        info, loaded = None, None
        if self.rank == 0 and self.train.checkpoint.resume:
            try:
                loaded = self.store.latest()
                if loaded is not None:
                    accept(loaded)
                    m = loaded.manifest
                    info = {"step": m["step"], "cursor": m["cursor"], "path": str(loaded.path)}
                    log.info("resuming from %s (step %d)", loaded.path, m["step"])
                    if self.tracker is not None:     # a resubmission: the run it continues
                        self.tracker.resumed(loaded.path, m.get("job_id"))
            except UserError as e:     # every rank stops on it, none waits for rank 0
                info = {"error": str(e)}
        return self.ranks.broadcast_object(info), loaded

    # ---------------------------------------------------------------- the vote
    def vote_due(self, tick: int) -> bool:
        return self.vote_handle is None and self.policy.poll_due(tick)

    def post_vote(self, tick: int, times: list[float], state_bytes: int = 0,
                  vote_seconds: float | None = None, loss_sum: float = float("nan"),
                  own: float | None = None, wait: float | None = None) -> None:
        """Post this rank's vote at ``tick`` (a step, or a call of the script's should_stop):
        stop (the flag, or rank 0's clock), save (every_minutes passed), the next interval
        from ``times`` (recent step times), ``loss_sum``, which progress shows, and this
        rank's ``own`` time and allreduce ``wait`` per step
        (:mod:`hpcsuite.runs.stragglers`)."""
        wants_stop = self.flag.raised or self.time_limit_near(times, state_bytes, vote_seconds)
        if wants_stop and self.noticed_step is None:
            self.noticed_step = self.progress.step
        interval = Policy.propose_interval(times, vote_seconds or VOTE_SECONDS)
        self.vote_handle = self.ranks.vote_start(vote.encode(
            wants_stop, self.policy.time_to_save(time.monotonic()), interval, loss_sum,
            self.rank, self.size, own, wait))
        self.vote_tick = tick
        self.policy.polled(tick)

    def read_vote(self) -> vote.Vote:
        """The ranks' answer to the posted vote (the same on every rank); a stop is agreed."""
        result = vote.decode(self.ranks.vote_result(self.vote_handle), self.size)
        self.vote_handle = None
        self.policy.agreed(self.vote_tick, result.interval)
        if result.stop and not self.stopped:
            self.stopped = True
            if self.rank == 0:
                self.stop_reason = self.reason()
                log.info("stopping at step %d (%s)", self.progress.step, self.stop_reason)
        return result

    def settle_vote(self) -> None:
        """Collect a vote still in flight at the end (every rank posted it; every rank reads)."""
        if self.vote_handle is not None:
            self.ranks.vote_result(self.vote_handle)
            self.vote_handle = None

    def time_limit_near(self, times: list[float], state_bytes: int,
                        vote_seconds: float | None) -> bool:
        """Rank 0's clock says stop now (see :mod:`.timelimit`); ``vote_seconds`` None: the
        current interval at the median step time."""
        if self.time_limit is None:
            return False
        recent = sorted(times[-20:])
        median = recent[len(recent) // 2] if recent else 0.0
        seconds = self.policy.poll_every * median if vote_seconds is None else vote_seconds
        return self.time_limit.near([c["seconds"] for c in self.metrics.checkpoints],
                                    state_bytes, median, seconds)

    def reason(self) -> str:
        """time_limit or preempted, by rank 0's clock."""
        from .timelimit import stop_reason

        return stop_reason(self.time_limit, self.train.preemption.signal_lead(self.train.checkpoint.enabled))

    # ---------------------------------------------------------------- save
    def save(self, reason: str, state: Callable[[], tuple[dict, dict]]) -> str | None:
        """This step's checkpoint (collective in name only: rank 0 writes). ``state()``, called
        on rank 0: the tensors ``{group: {name: array}}`` and the mode's manifest fields."""
        p = self.progress
        self.saved_step = p.step
        self.policy.saved(time.monotonic())
        if self.rank != 0:
            return None
        tensors, fields = state()
        manifest = {"step": p.step, "epoch": p.cursor.epoch, "cursor": p.cursor.to_json(),
                    "world_size": self.size, "batch_size": self.train.batch_size,
                    "grad_accumulation": self.train.grad_accumulation,
                    "spec_digest": self.job.digest(), "job_id": job_id(),
                    "reason": reason, **fields}
        saved = self.store.save(p.step, tensors, manifest)
        self.metrics.checkpoints.append({"step": p.step, "seconds": saved.seconds,
                                         "bytes": saved.bytes, "reason": reason,
                                         "path": str(saved.path)})
        log.info("checkpoint %s (%s, %.3fs)", saved.path, reason, saved.seconds)
        if self.chart is not None:       # the points up to a checkpoint outlive a crash
            self.chart.flush()
        return str(saved.path)

    # ---------------------------------------------------------------- TensorBoard
    def chart_due(self) -> bool:
        """Rank 0 charts, and a training point is due (see :data:`hpcsuite.runtime.observe.chart.CHART_SECONDS`)."""
        return self.chart is not None and self.chart.due()

    def chart_training(self, step: int, **values: float | None) -> None:
        """Rank 0's training point at ``step``: ``values`` and the samples/s since the last."""
        m = self.metrics
        self.chart.training(step, self.progress.start_step, values, m.step_times, m.real)

    def chart_point(self, step: int, values: dict) -> None:
        """Any other point (validation, utilisation); nothing on a rank that does not chart."""
        if self.chart is not None:
            self.chart.add(step, self.progress.start_step, values)

    def close_chart(self) -> None:
        if self.chart is not None:
            self.chart.close()

    def track_results(self, path: Path | None, status: str) -> None:
        """Rank 0, once results.json is published: it and the status end the attempt's part
        of the MLflow run (train.tracking)."""
        if self.tracker is not None:
            self.tracker.finish(path, status)

    # ---------------------------------------------------------------- progress
    def progress_due(self) -> bool:
        return self.rank == 0 and time.monotonic() - self.progress_at >= PROGRESS_SECONDS

    def write_progress(self, step: int, epoch: int, **fields) -> None:
        """Rank 0 writes progress.json: the step, the recent throughput, the attempt, and the
        mode's ``fields`` (loss, lr, metrics)."""
        m = self.metrics
        self.progress_at = time.monotonic()
        times, real = m.step_times[-50:], m.real[-50:]
        rate = sum(real[-len(times):]) / sum(times) if times and real and sum(times) > 0 else None
        write_progress(self.run_dir, {"step": step, "epoch": epoch, "max_steps": self.train.max_steps,
                                      "samples_per_s": rate, **fields, "attempt": attempt_number(),
                                      "time": time.time()})

    # ---------------------------------------------------------------- results
    def note(self, elapsed: float, checksum: str | None, **more) -> dict:
        """This rank's note for the results: host, samples, time, checksum, how it saw the
        stop, and the mode's ``more``; the ranks trade them with :meth:`gather`."""
        flag = self.flag
        return {**more, "host": hostname(), "samples": self.metrics.samples, "elapsed": elapsed,
                "checksum": checksum, "noticed": self.noticed_step, "signal": flag.signal,
                "after_signal": time.monotonic() - flag.at if self.stopped and flag.at else None}

    def gather(self, note: dict) -> list[dict] | None:
        """Every rank's note, by rank, on rank 0; None on the others (collective). Each rank
        writes its note, per-step series and all, to its own file (``startup/attempt-N/
        note-R.json``); once every rank has (a broadcast: Horovod runs a collective only when
        every rank has asked for it), rank 0 reads them. Not an allgather: that handed every
        rank every rank's series, N² in all (~2.3 GB of pickles per rank at 1,000 ranks)."""
        from ...runs.results import write_json_atomic

        run, attempt = RunDir(self.run_dir), attempt_number()
        path = run.attempt_file(attempt, "note", self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, plain(note), durable=False)
        self.ranks.broadcast_object(None)
        if self.rank != 0:
            return None
        return [json.loads(run.attempt_file(attempt, "note", r).read_text())
                for r in range(self.size)]

    def last_checkpoint_step(self) -> int | None:
        """The step of the job's newest committed checkpoint (this attempt's or an earlier
        one's), None when there is none: read on rank 0, which writes the results."""
        if self.saved_step is not None:
            return self.saved_step
        from ...runs.checkpoint_dir import newest_checkpoint

        newest = newest_checkpoint(self.store.root)
        return newest[1].get("step") if newest else None

    def status(self) -> str:
        """completed; preempted or time_limit when the ranks stopped and saved a checkpoint at
        that step; stopped (:data:`~hpcsuite.runs.attempts.UNSAVED`) when they stopped without
        one (no checkpoint keys, or a script that did not save): never called a save."""
        if not self.stopped:
            return "completed"
        return self.stop_reason if self.saved_step == self.progress.step else UNSAVED

    def write_rank_record(self, record: dict) -> None:
        from ...runs.results import write_json_atomic

        write_json_atomic(RunDir(self.run_dir).rank_record(self.rank), record)

    def results(self, gathered: list[dict], status: str, **fields) -> Results:
        """The record rank 0 writes as results.json, from the ranks' notes; ``fields``: the
        mode's own (model, dataset_samples, epochs, loss, ...)."""
        m, p = self.metrics, self.progress
        elapsed = max(g["elapsed"] for g in gathered)
        total = sum(g["samples"] for g in gathered)
        return Results(
            job=self.job.name, status=status, backend=self.train.backend,
            stop=stop_record(self.stop_reason, gathered, p.step, self.time_limit,
                             self.last_checkpoint_step()) if status in (*SAVED, UNSAVED) else {},
            world_size=self.size, hosts=[g["host"] for g in gathered],
            steps=p.step - p.start_step, start_step=p.start_step, final_step=p.step,
            cursor=p.cursor.to_json(), resumed_from=p.resumed_from,
            world_change=self.world_change or {},
            batch_size_per_rank=self.train.batch_size, grad_accumulation=self.train.grad_accumulation,
            precision=self.train.precision, samples=total, elapsed_s=elapsed,
            samples_per_s=total / elapsed if elapsed else 0.0,
            samples_per_s_steady=steady_throughput(m.step_times, m.real[:len(m.step_times)]),
            samples_per_s_per_rank=[g["samples"] / elapsed if elapsed else 0.0 for g in gathered],
            step_time_s=step_stats(m.step_times), step_times_s=m.step_times,
            checkpoints=m.checkpoints, checkpoint_time_s=sum(c["seconds"] for c in m.checkpoints),
            param_checksums=[g["checksum"] for g in gathered if g["checksum"] is not None],
            spec_digest=self.job.digest(), **fields)


def plain(obj):
    """``obj`` with numpy's scalars and arrays as Python's (a note is written as JSON)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj.tolist() if hasattr(obj, "tolist") else obj


def stop_record(reason: str, gathered: list[dict], step: int, time_limit,
                saved_step: int | None) -> dict:
    """How a stop went, for results.json: from the ranks' notes at the report, and the step
    of the newest committed checkpoint (None: there is none), which is ``step`` when the stop
    saved one."""
    signals = [g["signal"] for g in gathered if g.get("signal")]
    after = [g["after_signal"] for g in gathered if g.get("after_signal") is not None]
    noticed = [g["noticed"] for g in gathered if g.get("noticed") is not None]
    left = time_limit.left() if time_limit is not None else None
    return {"reason": reason, "signal": signals[0] if signals else None,
            "seconds_after_signal": max(after) if after else None,
            "steps_after_notice": step - min(noticed) if noticed else None,
            "seconds_left": left, "saved": saved_step == step, "checkpoint_step": saved_step}


def checksum(params: dict) -> str:
    """The sha256 of named arrays, by name: equal on every rank when the ranks agree."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(params[name])).tobytes())
    return h.hexdigest()
