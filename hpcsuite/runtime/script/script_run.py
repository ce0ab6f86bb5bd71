"""Script mode's :class:`Run`: this rank's view of the job a user's own training script runs,
an adapter over the one training :class:`~hpcsuite.runtime.session.session.Session` the managed loop runs on too.

Users reach it as ``hpcsuite.api.Run`` (:mod:`hpcsuite.api`, the public face, documents it);
:mod:`.script` (``hpcsuite train`` with ``train.script``) finishes the Run a script left open.
Which job a Run belongs to is :mod:`.script_job`'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ...errors import UserError
from ...submit.spec import JobSpec
from ..session.balance import Balance
from .collectives import HorovodObjects
from ..rank.job_io import hostname, publish
from ..observe.netwatch import beat
from ..session.policy import VOTE_SECONDS
from .script_job import Handover, find_job, refuse_ranks_without_horovod
from ..session.session import RankCharts, Session, checksum
from ..input.sharding import Cursor, Sharder
from ..observe.monitor import thinned
from ..observe.tensorboard import own_time_values

log = logging.getLogger("hpcsuite.api")   # the name users' log lines have always shown

_ACTIVE: "Run | None" = None


@dataclass(frozen=True)
class Restored:
    step: int                                   # optimizer steps done before the checkpoint
    state: dict[str, dict[str, np.ndarray]]     # what run.save() was given
    extra: dict                                 # JSON-able extras given to run.save()
    path: str


class Run:
    """This rank's view of the job. ``hvd``: the initialised ``horovod.torch`` or
    ``horovod.tensorflow`` module (None: a single process, for trying a script by hand).

    The job is, first found first: ``job``; the one hpcsuite launched this rank in
    (``HPCSUITE_JOB``, or ``job.json`` in ``run_dir``/``HPCSUITE_RUN_DIR``); outside a job,
    ``spec`` (or ``HPCSUITE_SPEC``), a job spec resolved here and run in this process. With
    none of them it stops the script with one line saying how to run it (exit 2).

    A thin adapter: restoring, the stop vote, saving, progress and results are the
    :class:`~hpcsuite.runtime.session.session.Session`'s, the same as the managed loop's."""

    def __init__(self, hvd=None, job: JobSpec | None = None, run_dir: str | Path | None = None,
                 spec: str | Path | None = None):
        global _ACTIVE
        if hvd is None:
            refuse_ranks_without_horovod()
        ranks = HorovodObjects(hvd)
        self.hvd = ranks.hvd
        self.rank, self.size = ranks.rank, ranks.size
        self.job, self.run_dir = find_job(self.hvd, job, run_dir, spec)
        self.train = self.job.train
        self.args = list(self.train.args)
        self.session = Session(self.job, self.run_dir, ranks, watch=Handover.watch,
                               charts=RankCharts.open(self.job, self.run_dir, self.rank))
        self.vote_seconds = VOTE_SECONDS     # the ranks vote on stopping about this often
        self._calls = 0
        self._call_times: list[float] = []
        self._last_call = time.perf_counter()
        self._save_agreed = False
        self._own_real: list[int] = []   # per step: this rank's real samples (weighs its loss)
        self._shown: dict | None = None  # size > 1: the last log()'s numbers, shown at the vote
        self._last = time.perf_counter()
        self._t0 = time.perf_counter()
        self._n: int | None = None
        self._finished = False
        self._timeline = None          # train.monitor.timeline_steps: made at the first log()
        # The slow rank (runs/stragglers.py), as in the managed loop: each rank's own time per
        # step is the script's time from one should_stop() to the next (hpcsuite's vote and
        # bookkeeping left out) less its wait in the allreduce, which the script lets hpcsuite
        # time (time_allreduce, waiting); without that wait nothing is sent, nobody is named.
        self._waits = _Waits()
        self.balance = Balance(self._waits, self.rank)
        self._steps: list[float] = []    # the script's own time per step, waits included
        self._returned: float | None = None   # when should_stop() last returned
        self.balance.start(self.session.gather(hostname()))
        self.sampler = _sampler(self)    # train.monitor: utilisation, the Prometheus textfile
        _ACTIVE = self

    # The session's state, by the names scripts and tests know.
    step = property(lambda self: self.session.progress.step)
    start_step = property(lambda self: self.session.progress.start_step)
    cursor = property(lambda self: self.session.progress.cursor)
    resumed_from = property(lambda self: self.session.progress.resumed_from)
    store = property(lambda self: self.session.store)
    _flag = property(lambda self: self.session.flag,
                     lambda self, flag: setattr(self.session, "flag", flag))

    @property
    def epoch(self) -> int:
        return self.session.progress.cursor.epoch

    # ---------------------------------------------------------------- resume
    def restore(self) -> Restored | None:
        """The latest good checkpoint of this job (collective). Rank 0 picks it and checks it
        was written by the same script; every rank reads it; progress continues from it."""
        loaded = self.session.restore(self._same_script)
        path = self.session.progress.resumed_from
        if path is None:
            return None
        if loaded is None:              # every other rank reads it too: not a hang either
            with self.session.watch.paused():
                loaded = self.session.store.load(Path(path))
        return Restored(self.step, loaded.tensors, loaded.manifest.get("extra", {}), path)

    def _same_script(self, loaded) -> None:
        wrote = loaded.manifest.get("script")
        if wrote != self.train.script:
            raise UserError(f"{loaded.path}: written by train.script {wrote!r}, this "
                            f"job runs {self.train.script!r}; use another checkpoint.dir")

    # ---------------------------------------------------------------- data
    def batches(self, n: int, batch_size: int | None = None, epochs: int | None = None,
                accumulation: int | None = None) -> Iterator:
        """This rank's micro-batches of ``n`` samples, from where the job is (after a restore:
        where the checkpoint left off) to the end of ``epochs`` (default train.epochs), at most
        train.max_steps steps. Each batch has ``ids`` (sample ids), ``weights`` (0 for padding),
        ``real``, ``last_in_step`` and ``epoch``. A batch counts as done once handed out:
        finish its step before calling save(). When they end, training is over: the rank's
        watches stop (:mod:`hpcsuite.runtime.observe.lifecycle`)."""
        yield from self._batches(n, batch_size, epochs, accumulation)
        self.session.watch.over()

    def _batches(self, n, batch_size, epochs, accumulation) -> Iterator:
        self._n = n
        s = self.session
        p, m = s.progress, s.metrics
        sharder = Sharder(n, self.size, self.rank, batch_size or self.train.batch_size, self.train.seed,
                          accumulation or self.train.grad_accumulation)
        epochs = epochs or self.train.epoch_limit(sharder.steps_per_epoch())
        own = 0
        while p.cursor.epoch < epochs:
            for batch in sharder.epoch(p.cursor):
                if s.policy.done(p.step):
                    return
                m.samples += batch.real
                own += batch.real
                if batch.last_in_step:
                    p.step += 1
                    p.cursor = batch.cursor
                    m.real.append(batch.step_real)
                    self._own_real.append(own)
                    own = 0
                yield batch
                if s.stopped:
                    return
            p.cursor = Cursor(p.cursor.epoch + 1, 0)

    # ---------------------------------------------------------------- recording
    def log(self, **metrics: float) -> None:
        """Record this optimizer step: its time (since the previous call) and the script's
        numbers (loss, accuracy, ...), which reach results.json. ``loss`` is taken as the mean
        over this rank's real samples; on more than one rank, what a user reads (the log line,
        progress.json, TensorBoard, results.json) is the global mean, which the ranks' vote in
        :meth:`should_stop` carries: those are shown at the vote."""
        s = self.session
        now = time.perf_counter()
        beat()                           # the network watch's clock (runtime/observe/netwatch.py)
        s.metrics.step_times.append(now - self._last)
        self._last = now
        for key, value in metrics.items():
            s.metrics.series.setdefault(key, []).append(float(value))
        mon = self.train.monitor
        if mon.timeline_steps and hasattr(self.hvd, "start_timeline"):
            if self._timeline is None:
                from ..observe.timeline import Window

                self._timeline = Window(self.hvd, self.rank, self.run_dir,
                                        mon.timeline_start_step, mon.timeline_steps)
            self._timeline.step(self.step)
        if self.size == 1:             # this rank's loss is the global mean
            self._show(self.step, self.epoch, metrics)
        else:
            self._shown = dict(metrics)

    def _show(self, step: int, epoch: int, metrics: dict, own: tuple = ()) -> None:
        """Rank 0's progress.json, TensorBoard point and log line, each when due; ``own``: every
        rank's own time per step at the vote, charted with the point."""
        s = self.session
        if s.progress_due():
            self._write_progress(metrics, step, epoch)
        if s.chart_due():              # rank 0, train.monitor.tensorboard, a few times a second
            s.chart_training(step, **metrics)
            s.chart_point(step, own_time_values(own))
        if self.rank == 0 and s.policy.log_due(time.monotonic()):
            shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            log.info("step %d, epoch %d%s", step, epoch, f", {shown}" if shown else "")

    def _loss_sum(self) -> float:
        """This step's loss summed over this rank's real samples (NaN: none logged this step)."""
        series = self.session.metrics.series.get("loss", [])
        if self._shown is None or "loss" not in self._shown or not self._own_real:
            return float("nan")
        return series[-1] * self._own_real[-1]

    def _write_progress(self, metrics: dict, step: int, epoch: int) -> None:
        self.session.write_progress(
            step, epoch, loss=float(metrics["loss"]) if "loss" in metrics else None,
            metrics={k: float(v) for k, v in metrics.items()}, slow_rank=self.balance.found)

    # ---------------------------------------------------------------- stopping and saving
    def should_stop(self) -> bool:
        """True on every rank at the same call once any rank got the preemption signal
        (collective: call it once per optimizer step on every rank). The ranks vote about
        every ``vote_seconds`` (at least every step when steps are slower than that), so a
        stop takes effect within one interval."""
        self._calls += 1
        now = time.perf_counter()
        self._call_times.append(now - self._last_call)
        self._last_call = now
        if self._returned is not None:      # the script's step since the previous call
            self._steps.append(now - self._returned)
        try:
            stop = self._vote()
        finally:
            self._returned = time.perf_counter()
        if stop:                            # the script's training is over (it saves, ends)
            self.session.watch.over()
        return stop

    def _vote(self) -> bool:
        s = self.session
        if s.stopped:
            return True
        tick = s.progress.start_step + self._calls   # the first call votes
        if not s.vote_due(tick):
            return False
        own, wait = self.balance.at_vote(self._steps)
        s.post_vote(tick, self._call_times[1:] or self._call_times, 0, self.vote_seconds,
                    self._loss_sum(), own, wait)
        result = s.read_vote()
        self.balance.read(result.own, result.wait)
        if self.sampler is not None:
            self.sampler.balance = (own, wait, self.balance.found)
        self._save_agreed = result.save
        if self._shown is not None and s.metrics.real:
            shown = dict(self._shown)
            if "loss" in shown and result.loss_sum == result.loss_sum:   # NaN: a rank had none
                shown["loss"] = result.loss_sum / s.metrics.real[-1]
            elif "loss" in shown:
                del shown["loss"]
            self._show(self.step, self.epoch, shown, result.own)
            self._shown = None
        return s.stopped

    # ---------------------------------------------------------------- the slow rank
    def time_allreduce(self, optimizer):
        """Time the gradients' allreduce of ``optimizer``, a ``horovod.torch``
        DistributedOptimizer, and return it: its ``synchronize()`` (which ``step()`` calls) is
        this rank's wait for the others, the rest of its time between two should_stop() calls
        its own work, and rank 0 names a rank the others wait for, by the managed loop's rule
        (:mod:`hpcsuite.runs.stragglers`). On a GPU the queued backward is waited for first,
        so the wait starts when this rank's own work is done."""
        sync = getattr(optimizer, "synchronize", None)
        if not callable(sync):
            raise UserError(f"run.time_allreduce: {type(optimizer).__name__} has no "
                            "synchronize(): give it hvd.DistributedOptimizer(...), or time "
                            "the script's own allreduce with `with run.waiting(): ...`")
        if getattr(sync, "timed_by_hpcsuite", False):
            return optimizer
        drain = _cuda_drain(optimizer)

        def synchronize(*args, **kwargs):
            drain()
            with self.waiting():
                return sync(*args, **kwargs)

        synchronize.timed_by_hpcsuite = True
        optimizer.synchronize = synchronize
        return optimizer

    @contextmanager
    def waiting(self):
        """Time the block as this rank's wait for the other ranks: the script's own allreduce
        of the gradients (``hvd.allreduce`` of each, or ``hvd.grouped_allreduce``), for a
        script without a DistributedOptimizer (see :meth:`time_allreduce`)."""
        self._waits.timed = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._waits.seconds += time.perf_counter() - t0

    def checkpoint_due(self) -> bool:
        """Whether this step should be saved: every train.checkpoint.every_steps, or when the
        ranks' last vote found every_minutes passed (the same answer on every rank)."""
        due = self.session.policy.save_due(self.step, self._save_agreed)
        self._save_agreed = False
        return due

    def save(self, state: dict, extra: dict | None = None, reason: str | None = None) -> str | None:
        """Save ``state`` (``{group: {name: array}}`` or ``{name: array}``) as this step's
        checkpoint, with the data position, atomically; rank 0 writes, other ranks return None."""
        if state and all(not isinstance(v, dict) for v in state.values()):
            state = {"state": state}
        s = self.session
        reason = reason or (s.stop_reason if s.stopped else "interval")

        def arrays():
            tensors = {g: {k: np.asarray(v) for k, v in a.items()} for g, a in state.items()}
            return tensors, {"script": self.train.script, "seed": self.train.seed, "extra": extra or {}}

        return s.save(reason, arrays)

    # ---------------------------------------------------------------- results
    def finish(self, params: dict | None = None, status: str | None = None, **extra) -> None:
        """Write this rank's record and, on rank 0, results.json (collective). ``params``:
        the model's arrays, whose checksum shows the ranks ended identical."""
        if self._finished:
            return
        self._finished = True
        self.session.watch.over()
        s = self.session
        m = s.metrics
        status = status or s.status()
        elapsed = time.perf_counter() - self._t0
        if self._timeline is not None:
            self._timeline.close(self.step)
        utilisation = self.sampler.stop(status) if self.sampler is not None else []
        mine = s.note(elapsed, checksum(params) if params is not None else None,
                      rank=self.rank, utilisation=thinned(utilisation), **self.balance.note())
        s.write_rank_record({**mine, "metrics": m.series, "own_real": self._own_real,
                             "utilisation": utilisation,      # every sample (rank 0 gets 120)
                             "steps": self.step - self.start_step, "step_time_s": m.step_times})
        loss = global_loss(s.ranks, m.series.get("loss", []), self._own_real) \
            if s.ranks.broadcast_object("loss" in m.series) else None
        gathered = s.gather(mine)
        if self.rank != 0:
            return
        metrics = {k: list(v) for k, v in m.series.items()}   # every run.log() series
        if loss is not None:
            metrics["loss"] = loss
        if m.step_times:       # the last step, not one up to 2 s before it
            last = {k: v[-1] for k, v in metrics.items() if v}
            self._write_progress(last, self.step, self.epoch)
            if s.chart is not None and s.chart.last_step != self.step:
                s.chart_training(self.step, **last)
        s.close_chart()
        results = s.results(
            gathered, status, mode="script", model=self.train.script, dataset_samples=self._n or 0,
            epochs=self.train.epochs or 1, loss=list(metrics.get("loss", [])),
            metrics={**metrics, **extra}, versions=_versions(),
            rank_balance=self.balance.record(gathered),
            utilisation=[g["utilisation"] for g in gathered] if self.sampler is not None else [])
        if params is not None:                  # what the script's allreduce carries, at best
            results.gradient_tensors = len(params)
            results.gradient_bytes = 4 * sum(int(np.asarray(v).size) for v in params.values())
        path = publish(self.run_dir, results)
        print(f"hpcsuite script: {status} at step {self.step}; wrote {path}", flush=True)
        s.track_results(path, status)


class _Waits:
    """The script's time in the allreduce, where the script lets hpcsuite time it: what
    :class:`~hpcsuite.runtime.session.balance.Balance` takes at each vote (None: never timed)."""

    def __init__(self):
        self.timed, self.seconds = False, 0.0

    def take_wait(self) -> float | None:
        waited, self.seconds = self.seconds, 0.0
        return waited if self.timed else None


def _sampler(run: Run):
    """train.monitor's sampler of this rank (its step read from ``run``), or None. CPU and
    memory only: hpcsuite does not know the script's device, nor how long it waits for data,
    which the starved-GPU rule (runs/gpu_use.py) would need beside the GPU's figures."""
    mon = run.train.monitor
    if not mon.enabled:
        return None
    from ..observe.monitor import Sampler

    return Sampler(mon.interval_seconds, run.rank, "cpu", mon.prometheus_dir, run.job.name,
                   hostname(), run_dir=run.run_dir).start(run)


def _cuda_drain(optimizer):
    """What waits for the GPU's queued work before the allreduce is timed (nothing on a CPU)."""
    torch = sys.modules.get("torch")
    on_cuda = torch is not None and any(getattr(p, "is_cuda", False)
                                        for g in getattr(optimizer, "param_groups", ())
                                        for p in g["params"])
    return torch.cuda.current_stream().synchronize if on_cuda else (lambda: None)


def global_loss(ranks, series: list[float], own_real: list[int]) -> list[float]:
    """Each step's loss over every rank's real samples (collective; rank 0 uses it): each
    rank's logged mean weighted by its real samples that step (weight 1 where its losses do not
    line up with its steps), summed in one allreduce, so no rank reads another's series; rank
    0's own series where the ranks logged different numbers of losses."""
    n = ranks.broadcast_object(len(series))
    if ranks.allreduce_sums([float(len(series) != n)])[0] or not n:
        return list(series)
    weights = [float(c) for c in own_real] if len(own_real) == n else [1.0] * n
    sums = ranks.allreduce_sums([v * c for v, c in zip(series, weights)] + weights
                                + [float(v) for v in series])
    return [sums[i] / sums[n + i] if sums[n + i] else sums[2 * n + i] / ranks.size
            for i in range(n)]


def _versions() -> dict:
    out = {"python": sys.version.split()[0], "numpy": np.__version__}
    for name in ("torch", "tensorflow", "horovod"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", None)
    return out


def active() -> Run | None:
    """The Run a script created (script mode finishes it if the script did not)."""
    return _ACTIVE


def load_checkpoint(directory: str | os.PathLike) -> Restored:
    """The latest good checkpoint in ``directory``, read only: another job's
    ``train.checkpoint.dir`` (relative to the submit directory), for a job that evaluates or
    fine-tunes what it trained. Not collective: each rank reads it. A damaged newer checkpoint
    is skipped with a warning; no checkpoint at all, or only damaged ones, is one line (exit 2)."""
    from ..session.checkpoint import CheckpointError, CheckpointStore

    root = Path(directory)
    loaded = CheckpointStore(root).latest()
    if loaded is None:
        raise CheckpointError(f"{root}: no checkpoint to load (is it the train.checkpoint.dir "
                              "of a job that saved one?)")
    return Restored(loaded.step, loaded.tensors, loaded.manifest.get("extra", {}),
                    str(loaded.path))
