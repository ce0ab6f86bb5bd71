"""The managed training loop both backends share: epochs of steps, the learning-rate
schedule, validation, the ledger.

A backend (:mod:`hpcsuite.runtime.frameworks.torch_backend`, :mod:`hpcsuite.runtime.frameworks.tf_backend`) owns the model, the Horovod-wrapped
optimizer and the framework's data adapter; restoring, the ranks' vote, saving, the time-limit
watch, progress and results are the :class:`~.session.Session`'s, shared with script mode
(:mod:`hpcsuite.api`). :class:`Trainer` is the managed mode's adapter: it calls the steps and
tells the session when a step ended.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import UserError
from ...runs.attempts import attempt_number
from ...runs.results import energy_record
from ...runs.rundir import RunDir
from ...submit.spec import JobSpec
from .balance import Balance
from .checkpoint import Loaded
from ..input.data import open_train_eval
from ..rank.job_io import hostname
from ..observe.netwatch import beat
from .policy import Policy
from .schedule import learning_rate
from .session import Progress, RankCharts, Session
from ..frameworks.protocol import Backend
from ..input.sharding import Cursor, Sharder
from ..rank.signals import FLAG, StopFlag
from ..rank.startup import OFF
from ..observe.monitor import thinned
from ..observe.tensorboard import own_time_values, utilisation_values

if TYPE_CHECKING:
    from ...runs.results import Results

log = logging.getLogger(__name__)


# What a checkpoint must agree on with the job resuming from it; world and batch size may change.
_DATA_KEYS = ("kind", "samples", "shape", "classes", "path", "inputs", "labels", "factory", "args")


def resume_identity(job: JobSpec) -> dict:
    t = job.to_dict()["train"]
    data = {k: t["data"].get(k) for k in _DATA_KEYS}
    split = (t.get("eval") or {}).get("split", 0.0)
    return {"backend": t["backend"], "model": t["model"], "data": data, "seed": t["seed"],
            "eval_split": split}


def _compatible(job: JobSpec, manifest: dict, path: Path) -> None:
    want = resume_identity(job)
    have_data = {k: (manifest.get("data") or {}).get(k) for k in _DATA_KEYS}
    have = {"backend": manifest.get("backend"), "model": manifest.get("model"), "data": have_data,
            "seed": manifest.get("seed"), "eval_split": manifest.get("eval_split", 0.0)}
    for key, value in want.items():
        if key == "data":
            changed = [k for k in _DATA_KEYS if have_data.get(k) is not None and have_data[k] != value[k]]
            if changed:
                k = changed[0]
                raise UserError(f"{path}: written by a job with train.data.{k} = {have_data[k]!r}, "
                                f"this job has {value[k]!r}; use another checkpoint.dir or set "
                                "checkpoint.resume: false")
        elif have[key] != value:
            name = "eval.split" if key == "eval_split" else key
            raise UserError(f"{path}: written by a job with train.{name} = {have[key]!r}, this job "
                            f"has {value!r}; use another checkpoint.dir or set checkpoint.resume: false")


class Trainer:
    def __init__(self, job: JobSpec, run_dir: Path, backend: Backend, flag: StopFlag = FLAG,
                 watch=OFF):
        self.job, self.run_dir, self.backend = job, run_dir, backend
        self.train = job.train
        self.session = Session(job, run_dir, backend, flag, watch,
                               RankCharts.open(job, run_dir, backend.rank))
        self.store, self.metrics = self.session.store, self.session.metrics
        self.ledger = None
        self.lr: float | None = None
        self.epochs = float(self.train.epochs or 1)   # run() knows it once the data is open
        self.timeline = None         # a Horovod timeline window (train.monitor.timeline_steps)
        self.sampler = None
        self.utilisation: list[dict] = []
        self.charted_samples = 0     # rank 0's utilisation samples already in TensorBoard
        self.energy: dict = {}       # rank 0, at the report: results.json's energy fields
        self._state_bytes: int | None = None
        self.balance = Balance(backend, backend.rank)   # own time and wait; the slow rank

    # ---------------------------------------------------------------- resume
    def restore(self) -> Progress:
        """The session's restore, loading the checkpoint into the backend on rank 0; then
        rank 0's parameters and optimizer state, loaded or fresh, on every rank."""
        self.session.restore(self._load)
        self.backend.broadcast_state()
        return self.session.progress

    def _load(self, loaded: Loaded) -> None:
        _compatible(self.job, loaded.manifest, loaded.path)
        try:
            self.backend.load_state(loaded.tensors, loaded.manifest.get("extra", {}))
        except (KeyError, ValueError, RuntimeError) as e:
            raise UserError(f"{loaded.path}: does not fit this model ({e})") from None

    # ---------------------------------------------------------------- save
    def save(self, p: Progress, reason: str) -> None:
        def state():
            tensors, extra = self.backend.state()
            return tensors, {"batch_size": self.train.batch_size, **resume_identity(self.job),
                             "data": self.job.to_dict()["train"]["data"],
                             "versions": self.backend.versions(), "extra": extra}

        self.session.save(reason, state)
        if self.ledger:
            self.ledger.flush()

    # ---------------------------------------------------------------- run
    def run(self) -> tuple[dict, "Results | None"]:
        from ... import usercode

        data, held = open_train_eval(self.train, self.train.seed,
                                     usercode.search_dirs(self.train.pythonpath))
        self.backend.build(data)
        p = self.restore()
        self.balance.start(self.session.gather(hostname()))   # rank 0's, for the slow-rank rule
        if self.train.ledger:
            paths = RunDir(self.run_dir)
            paths.ledger_dir.mkdir(exist_ok=True)
            self.ledger = open(paths.ledger(self.backend.rank, attempt_number()), "a")
        sharder = Sharder(len(data), self.backend.size, self.backend.rank, self.train.batch_size,
                          self.train.seed, self.train.grad_accumulation)
        policy = self.session.policy
        self.epochs = self.train.epoch_limit(sharder.steps_per_epoch())
        if self.backend.rank == 0:
            log.info("training: %d ranks, %d samples%s, %d steps per epoch, from step %d (epoch "
                     "%d, sample %d)", self.backend.size, len(data),
                     f" (+{len(held)} held out)" if held is not None else "",
                     sharder.steps_per_epoch(), p.step, p.cursor.epoch, p.cursor.consumed)
        stop = None
        self.sampler = self.start_sampler(p)
        mon = self.train.monitor
        if mon.timeline_steps:
            from ..observe.timeline import Window

            self.timeline = Window(self.backend.hvd, self.backend.rank, self.run_dir,
                                   mon.timeline_start_step, mon.timeline_steps)
            self.timeline.step(p.step)
        t_start = time.perf_counter()
        while p.cursor.epoch < self.epochs and stop is None and not policy.done(p.step):
            stop = self.train_epoch(data, sharder, p, policy)
            if stop is None and p.cursor.consumed >= len(data):
                p.cursor = Cursor(p.cursor.epoch + 1, 0)
                if held is not None and policy.eval_due(p.cursor.epoch):
                    self.evaluate(held, p)
        elapsed = time.perf_counter() - t_start
        self.session.watch.over()   # the final save, evaluation and report are not watched
        if self.timeline is not None:
            self.timeline.close(p.step)
        self.utilisation = self.sampler.stop(self.session.status()) \
            if self.sampler is not None else []
        self.session.settle_vote()
        self.settle_losses()
        m = self.metrics
        if self.train.checkpoint.enabled and stop is None and p.step > p.start_step and \
                not (m.checkpoints and m.checkpoints[-1]["step"] == p.step):
            self.save(p, "final")
        if held is not None and stop is None and not (m.evals and m.evals[-1]["step"] == p.step):
            self.evaluate(held, p)
        if self.ledger:
            self.ledger.close()
        return self.report(p, elapsed, stop, len(data))

    def start_sampler(self, p: Progress):
        mon = self.train.monitor
        if not mon.enabled:
            return None
        from ..observe.monitor import Sampler

        return Sampler(mon.interval_seconds, self.backend.rank,
                       getattr(self.backend, "device", "cpu"), mon.prometheus_dir, self.job.name,
                       hostname(), run_dir=self.run_dir).start(p)

    def train_epoch(self, data, sharder: Sharder, p: Progress, policy: Policy) -> str | None:
        """Train from ``p.cursor`` to the end of its epoch; the stop reason, if stopped.

        A step's time runs from the end of the previous step to the end of this one: the
        loop's bookkeeping and the ranks' votes count, a checkpoint's save is recorded with
        the checkpoint instead. Everything per micro-batch here runs on every step of every
        job, so it is kept to list appends and arithmetic."""
        m, b, clock = self.metrics, self.backend, time.perf_counter
        batches = list(sharder.epoch(p.cursor))
        micro_step, size, pending = b.micro_step, b.size, m.pending
        data_time = 0.0
        t0 = fetch0 = clock()
        first = True
        for batch, inputs in b.feed(data, batches):
            data_time += clock() - fetch0
            if first:
                self.set_rate(p, sharder, len(data))
                first = False
            pending.append(micro_step(inputs, size / batch.step_real, batch.last_in_step,
                                      batch.real < len(batch.ids)))
            m.samples += batch.real
            if self.ledger:
                real = batch.ids[batch.weights > 0]
                self.ledger.write(f"{batch.cursor.epoch} {p.step} {' '.join(map(str, real))}\n")
            if batch.last_in_step:
                p.step += 1
                p.cursor = batch.cursor
                now = clock()
                beat()                   # the network watch's clock (runtime/observe/netwatch.py)
                m.step_times.append(now - t0)
                m.data_times.append(data_time)
                m.real.append(batch.step_real)
                m.lr.append(self.lr)
                data_time, first = 0.0, True
                stop = self.after_step(p, policy, batch.step_real)
                if stop or policy.done(p.step):
                    return stop
                later = clock()
                if self.session.saved_step == p.step:
                    t0 = later
                else:    # the vote's bookkeeping (rank 0's above all) is no rank's own work
                    t0, self.balance.aside = now, self.balance.aside + later - now
            fetch0 = clock()
        return None

    def settle_losses(self) -> None:
        """Move the pending micro-batch losses into ``loss_sums`` as floats, one per step."""
        m = self.metrics
        if not m.pending:
            return
        values = self.backend.losses_to_floats(m.pending)
        k = self.train.grad_accumulation
        m.loss_sums.extend(float(sum(values[i:i + k])) for i in range(0, len(values), k))
        m.pending.clear()

    def set_rate(self, p: Progress, sharder: Sharder, n: int) -> None:
        """The schedule's rate for the step about to run (set only when it changes)."""
        s = self.train.schedule
        if self.lr is not None and s.decay == "constant" and p.cursor.epoch >= s.warmup_epochs:
            return   # past any warm-up a constant schedule has nothing to compute
        end = min(p.cursor.consumed + sharder.step_slots, n)
        rate = learning_rate(self.train.schedule, self.train.lr, self.backend.size,
                             p.cursor.epoch + end / n, self.epochs)
        if rate != self.lr:
            self.backend.set_lr(rate)
            self.lr = rate

    def after_step(self, p: Progress, policy: Policy, step_real: int) -> str | None:
        s, m = self.session, self.metrics
        stop = None
        save = False
        if self.timeline is not None:
            self.timeline.step(p.step)
        if s.vote_handle is not None and p.step > s.vote_tick:
            # The vote posted after the previous step went with this step's gradients.
            result = s.read_vote()
            self.balance.read(result.own, result.wait)
            stop = "preempted" if result.stop else None
            save = result.stop or result.save
            # Progress, charts and rank 0's log line all show the voted step's global mean
            # loss (every rank's loss sum), the number results.json records for that step.
            step, epoch, real = self.poll_at
            loss, lr = result.loss_sum / real, m.lr[step - p.step - 1]
            if s.progress_due():
                self.write_progress(step, epoch, real, loss)
            if s.chart_due():
                s.chart_training(step, loss=loss, learning_rate=lr)
                self.chart_utilisation()
                s.chart_point(step, own_time_values(result.own))
            if self.backend.rank == 0 and policy.log_due(time.monotonic()):
                log.info("step %d, epoch %d, loss %.4f, lr %.4g", step, epoch, loss, lr)
        if stop is None and s.vote_due(p.step):
            self.settle_losses()
            # The vote carries this step's loss sum too: progress shows the global mean.
            own, wait = self.balance.at_vote(m.step_times)
            if self.sampler is not None:       # the Prometheus textfile's gauges
                self.sampler.balance = (own, wait, self.balance.found)
            s.post_vote(p.step, m.step_times, self.state_bytes(), None,
                        m.loss_sums[-1] if m.loss_sums else float("nan"), own, wait)
            self.poll_at = (p.step, p.cursor.epoch, step_real)
        if policy.save_due(p.step, save):
            self.save(p, s.stop_reason if stop else "interval")
        return stop

    def state_bytes(self) -> int:
        """What a save writes, estimated before the first (parameters, 2 optimizer slots):
        asked of the backend once, and only when rank 0 watches the time limit."""
        if self._state_bytes is None:
            self._state_bytes = 0 if self.session.time_limit is None else \
                3 * 4 * sum(self.backend.gradient_sizes())
        return self._state_bytes

    def write_progress(self, step: int, epoch: int, step_real: int, loss: float | None) -> None:
        """Rank 0 writes progress.json: ``loss`` is the step's global mean, from the vote or the
        report's gather, never this rank's share alone."""
        self.session.write_progress(step, epoch, epochs=math.ceil(self.epochs),
                              loss=loss if loss == loss else None,   # NaN: none yet
                              lr=self.lr, slow_rank=self.balance.found)

    # ---------------------------------------------------------------- TensorBoard
    def chart_utilisation(self) -> None:
        """Rank 0's utilisation samples taken since the last call, as TensorBoard points."""
        if self.sampler is None:
            return
        new = self.sampler.samples[self.charted_samples:]
        self.charted_samples += len(new)
        for sample in new:
            self.session.chart_point(sample["step"], utilisation_values(0, sample))

    def chart_report(self, p: Progress, loss: list[float], gathered: list[dict]) -> None:
        """Rank 0's last points, stopped early or not: the last step's loss (the global mean
        results.json records), every other rank's utilisation; then the event file is closed."""
        s = self.session
        if s.chart is None:
            return
        if loss and s.chart.last_step != p.step:
            s.chart_training(p.step, loss=loss[-1], learning_rate=self.metrics.lr[-1])
        self.chart_utilisation()
        for rank, g in enumerate(gathered[1:] if self.sampler is not None else [], start=1):
            for sample in g["utilisation"]:
                s.chart_point(sample["step"], utilisation_values(rank, sample))
        if self.energy:
            s.chart_point(p.step, {"energy/joules": self.energy["energy_j"],
                                   "energy/samples_per_joule": self.energy["samples_per_joule"]})
        s.close_chart()

    # ---------------------------------------------------------------- validation
    def evaluate(self, held, p: Progress) -> dict:
        """Loss (and accuracy for classes) over the held-out data: each rank a disjoint share,
        every sample exactly once (padding has weight 0), sums combined across ranks."""
        ev = self.train.eval
        sharder = Sharder(len(held), self.backend.size, self.backend.rank,
                          ev.batch_size or self.train.batch_size, self.train.seed)
        loss = correct = real = 0.0
        for batch, inputs in self.backend.feed(held, list(sharder.epoch(Cursor(0, 0)))):
            batch_loss, batch_correct = self.backend.eval_step(inputs)
            loss, correct, real = loss + batch_loss, correct + batch_correct, real + batch.real
        totals = np.sum(self.backend.allgather_object([loss, correct, real]), axis=0)
        record = {"epoch": p.cursor.epoch, "step": p.step, "loss": float(totals[0] / totals[2]),
                  "accuracy": float(totals[1] / totals[2]) if held.classes is not None else None,
                  "samples": int(totals[2])}
        self.metrics.evals.append(record)
        self.session.chart_point(p.step, {"validation/loss": record["loss"],
                                    "validation/accuracy": record["accuracy"]})
        if self.backend.rank == 0:
            log.info("validation after epoch %d (step %d): loss %.4f%s", record["epoch"], p.step,
                     record["loss"], f", accuracy {100 * record['accuracy']:.2f}%"
                     if record["accuracy"] is not None else "")
        return record

    # ---------------------------------------------------------------- results
    def report(self, p: Progress, elapsed: float, stop: str | None, n: int) -> tuple[dict, "Results | None"]:
        s, m = self.session, self.metrics
        checksum = self.backend.checksum()
        # Each step's loss summed over the ranks: an allreduce of one number a step (every
        # rank's series stays its own; the notes rank 0 reads carry none).
        sums = self.backend.allreduce_sums(m.loss_sums) if m.loss_sums else []
        gathered = s.gather(s.note(elapsed, checksum, utilisation=thinned(self.utilisation),
                                   energy_j=self.sampler.energy_j if self.sampler else None,
                                   **self.balance.note()))
        per_rank = {"rank": self.backend.rank, "host": hostname(), "steps": p.step - p.start_step,
                    "samples": m.samples, "elapsed_s": elapsed, "step_time_s": m.step_times,
                    "data_time_s": m.data_times, "param_checksum": checksum,
                    "utilisation": self.utilisation,    # every sample (rank 0 gets 120)
                    **self.balance.note()}    # own work and allreduce wait per step
        if self.backend.rank != 0:
            return per_rank, None
        self.energy = energy_record([g["energy_j"] for g in gathered],
                                    sum(g["samples"] for g in gathered))
        loss = [total / real for total, real in zip(sums, m.real)]
        if loss:                                   # the last step, not one up to 2 s before it
            self.write_progress(p.step, p.cursor.epoch, m.real[-1], loss[-1])
        self.chart_report(p, loss, gathered)
        sizes = self.backend.gradient_sizes()
        results = s.results(
            gathered, s.status(), mode="managed", model=self.train.model, dataset_samples=n,
            epochs=math.ceil(self.epochs),
            data_wait_fraction=sum(m.data_times) / max(sum(m.step_times), 1e-12),
            loss=loss, lr=m.lr, eval=m.evals,
            utilisation=[g["utilisation"] for g in gathered] if self.sampler is not None else [],
            versions=self.backend.versions(), precision_seen=self.backend.precision_seen(),
            **self.energy,
            gradient_tensors=len(sizes), gradient_bytes=4 * sum(sizes),
            rank_balance=self.balance.record(gathered))
        return per_rank, results
