"""The training loop both backends share: sharding, checkpoints, preemption, validation, metrics.

A backend (:mod:`.torch_backend`, :mod:`.tf_backend`) owns the model, the Horovod-wrapped
optimizer and the framework's data adapter; everything about *which* samples, *when* to save,
stop or validate, and *what* to record lives here, once:

- :class:`Policy` makes the decisions from counters and clocks, and does nothing itself;
- :class:`Trainer` runs epochs of steps, acts on the decisions, and keeps :class:`Metrics`;
- :class:`~hpcsuite.results.Results` is what the run leaves behind.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from ..attempts import checkpoint_root  # noqa: F401 (api imports it from here)
from ..errors import UserError
from ..results import Results, step_stats, write_progress
from ..spec import JobSpec
from .checkpoint import CheckpointStore, Loaded
from .data import open_train_eval
from .schedule import learning_rate
from .sharding import Batch, Cursor, Sharder
from .signals import FLAG, StopFlag
from . import vote

log = logging.getLogger(__name__)

# Ranks agree on time- and signal-driven decisions (checkpoint now, stop now) through one tiny
# allreduce (a "vote") posted after a step and read after the next one: it travels with that
# step's gradient traffic instead of stalling a step, and every rank acts on the same step
# because every rank posts and reads at the same steps. A vote costs a step's worth of Horovod
# calls (~0.5 ms of CPU in PyTorch), so the votes are spaced by time: each vote also carries
# every rank's proposal for the next interval (about VOTE_SECONDS of steps), and all ranks adopt
# the smallest. A stop then takes effect at most one interval and one step after the signal.
POLL_STEPS = 10            # the interval until the step time is known
VOTE_SECONDS = 0.25
MAX_POLL_STEPS = 1000
LOG_SECONDS = 30
PROGRESS_SECONDS = 2.0     # rank 0 rewrites progress.json at most this often (at a vote)


class Backend(Protocol):
    name: str
    rank: int
    size: int
    local_rank: int

    def build(self, data) -> None: ...
    # (batch, inputs): inputs is the backend's own handle on the micro-batch's tensors.
    def feed(self, data, batches: list[Batch]) -> Iterator[tuple[Batch, object]]: ...
    def micro_step(self, inputs, scale: float, last: bool, padded: bool) -> object: ...
    def eval_step(self, inputs) -> tuple[float, float]: ...
    def set_lr(self, lr: float) -> None: ...
    def losses_to_floats(self, losses: list) -> list[float]: ...   # in one call for many
    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict]: ...
    def load_state(self, tensors: dict[str, dict[str, np.ndarray]], extra: dict) -> None: ...
    def broadcast_state(self) -> None: ...
    def broadcast_object(self, obj): ...
    def allgather_object(self, obj) -> list: ...
    def poll_start(self, values: list[int]) -> object: ...
    def poll_result(self, handle: object) -> list[int]: ...
    def checksum(self) -> str: ...
    def gradient_sizes(self) -> list[int]: ...
    def precision_seen(self) -> dict: ...  # what the training steps computed in (results)
    def versions(self) -> dict: ...
    def shutdown(self) -> None: ...


@dataclass
class Progress:
    step: int = 0                    # optimizer steps done, including resumed ones
    cursor: Cursor = field(default_factory=Cursor)
    start_step: int = 0
    resumed_from: str | None = None


@dataclass
class Metrics:
    """What one rank records while training."""
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
    samples: int = 0


class Policy:
    """When to poll, save, validate, log and stop. Pure decisions; the Trainer acts."""

    def __init__(self, job: JobSpec, start_step: int, now: float):
        self.t = job.train
        self.start_step = start_step
        self.last_save = now
        self.last_log = float("-inf")   # the first step is logged: training has begun
        # The first vote right after the first step, so that it (and, for TensorFlow, the
        # first run of the step variant that carries it) falls inside warm-up.
        self.next_poll = start_step + 1
        self.poll_every = POLL_STEPS

    def poll_due(self, step: int) -> bool:
        return step >= self.next_poll

    @staticmethod
    def propose_interval(step_times: list[float], seconds: float = VOTE_SECONDS) -> int:
        """Steps between votes for about ``seconds``, from the recent step times."""
        recent = sorted(step_times[-20:])
        if not recent:
            return POLL_STEPS
        median = recent[len(recent) // 2]
        return max(1, min(MAX_POLL_STEPS, int(seconds / max(median, 1e-6))))

    def polled(self, step: int) -> None:
        """A vote was posted at ``step``."""
        self.next_poll = step + self.poll_every

    def agreed(self, posted: int, every: int) -> None:
        """The vote posted at step ``posted`` was read: the ranks' interval from there."""
        self.poll_every = max(1, every)
        self.next_poll = posted + self.poll_every

    def time_to_save(self, now: float) -> bool:
        minutes = self.t.checkpoint.every_minutes
        return bool(minutes) and now - self.last_save >= minutes * 60

    def save_due(self, step: int, agreed: bool) -> bool:
        ck = self.t.checkpoint
        return ck.enabled and (agreed or bool(ck.every_steps and step % ck.every_steps == 0))

    def saved(self, now: float) -> None:
        self.last_save = now

    def log_due(self, now: float) -> bool:
        if now - self.last_log > LOG_SECONDS:
            self.last_log = now
            return True
        return False

    def done(self, step: int) -> bool:
        return bool(self.t.max_steps and step >= self.t.max_steps)

    def eval_due(self, epochs_done: int) -> bool:
        ev = self.t.eval
        return ev is not None and ev.enabled and epochs_done % ev.every_epochs == 0


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


def steady_throughput(step_times: list[float], real: list[int]) -> float:
    """Samples/s over the steps after warm-up (graph tracing, first allreduce negotiation):
    the first tenth of the steps, at most 10, is left out."""
    skip = min(10, len(step_times) // 10)
    seconds = sum(step_times[skip:])
    return sum(real[skip:]) / seconds if seconds else 0.0


class Trainer:
    def __init__(self, job: JobSpec, run_dir: Path, backend: Backend, flag: StopFlag = FLAG):
        self.job, self.run_dir, self.b = job, run_dir, backend
        self.t = job.train
        self.store = CheckpointStore(checkpoint_root(job, run_dir), self.t.checkpoint.keep)
        self.flag = flag
        self.metrics = Metrics()
        self.ledger = None
        self.lr: float | None = None
        self.saved_step: int | None = None   # the step of the latest checkpoint save
        self.progress_at = float("-inf")
        self.epochs = float(self.t.epochs or 1)   # run() knows it once the data is open
        self.timeline = None         # a Horovod timeline window (train.monitor.timeline_steps)
        self.sampler = None
        self.utilisation: list[dict] = []
        # Stopping before the time limit: rank 0 watches the clock (lead_seconds not 0).
        pre = self.t.preemption
        self.time_limit = None
        if backend.rank == 0 and pre.watches_time_limit(self.t.checkpoint.enabled):
            from .timelimit import TimeLimit

            self.time_limit = TimeLimit.from_slurm()
        self.noticed_step: int | None = None   # the vote step a stop was first asked for here

    # ---------------------------------------------------------------- resume
    def restore(self) -> Progress:
        info = None
        if self.b.rank == 0 and self.t.checkpoint.resume:
            try:
                loaded = self.store.latest()
                if loaded is not None:
                    _compatible(self.job, loaded.manifest, loaded.path)
                    self._load(loaded)
                    m = loaded.manifest
                    info = {"step": m["step"], "cursor": m["cursor"], "path": str(loaded.path)}
                    log.info("resuming from %s (step %d)", loaded.path, m["step"])
            except UserError as e:     # every rank stops on it, none waits for rank 0
                info = {"error": str(e)}
        info = self.b.broadcast_object(info)
        if info is not None and "error" in info:
            raise UserError(info["error"])
        self.b.broadcast_state()     # rank 0's parameters and optimizer state, loaded or fresh
        if info is None:
            return Progress()
        return Progress(step=info["step"], cursor=Cursor.from_json(info["cursor"]),
                        start_step=info["step"], resumed_from=info["path"])

    def _load(self, loaded: Loaded) -> None:
        try:
            self.b.load_state(loaded.tensors, loaded.manifest.get("extra", {}))
        except (KeyError, ValueError, RuntimeError) as e:
            raise UserError(f"{loaded.path}: does not fit this model ({e})") from None

    # ---------------------------------------------------------------- save
    def save(self, p: Progress, reason: str) -> None:
        self.saved_step = p.step
        if self.b.rank == 0:
            tensors, extra = self.b.state()
            manifest = {
                "step": p.step, "epoch": p.cursor.epoch, "cursor": p.cursor.to_json(),
                "world_size": self.b.size, "batch_size": self.t.batch_size,
                **resume_identity(self.job), "data": self.job.to_dict()["train"]["data"],
                "spec_digest": self.job.digest(), "job_id": os.environ.get("SLURM_JOB_ID"),
                "reason": reason, "versions": self.b.versions(), "extra": extra,
            }
            saved = self.store.save(p.step, tensors, manifest)
            self.metrics.checkpoints.append({"step": p.step, "seconds": saved.seconds,
                                             "bytes": saved.bytes, "reason": reason,
                                             "path": str(saved.path)})
            log.info("checkpoint %s (%s, %.3fs)", saved.path, reason, saved.seconds)
        if self.ledger:
            self.ledger.flush()

    # ---------------------------------------------------------------- run
    def run(self) -> tuple[dict, Results | None]:
        from .. import usercode

        data, held = open_train_eval(self.t, self.t.seed, usercode.search_dirs(self.t.pythonpath))
        self.b.build(data)
        p = self.restore()
        if self.t.ledger:
            (self.run_dir / "ledger").mkdir(exist_ok=True)
            attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
            self.ledger = open(self.run_dir / "ledger" / f"rank-{self.b.rank}-attempt-{attempt}.txt", "a")
        sharder = Sharder(len(data), self.b.size, self.b.rank, self.t.batch_size, self.t.seed,
                          self.t.grad_accumulation)
        policy = Policy(self.job, p.start_step, time.monotonic())
        self.epochs = self.t.epoch_limit(sharder.steps_per_epoch())
        if self.b.rank == 0:
            log.info("training: %d ranks, %d samples%s, %d steps per epoch, from step %d (epoch "
                     "%d, sample %d)", self.b.size, len(data),
                     f" (+{len(held)} held out)" if held is not None else "",
                     sharder.steps_per_epoch(), p.step, p.cursor.epoch, p.cursor.consumed)
        self.poll = None
        self.poll_step = p.start_step
        stop = None
        self.sampler = self.start_sampler(p)
        mon = self.t.monitor
        if mon.timeline_steps:
            from .timeline import Window

            self.timeline = Window(self.b.hvd, self.b.rank, self.run_dir,
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
        if self.timeline is not None:
            self.timeline.close(p.step)
        self.utilisation = self.sampler.stop() if self.sampler is not None else []
        if self.poll is not None:
            self.b.poll_result(self.poll)          # every rank posted it; every rank collects it
        self.settle_losses()
        m = self.metrics
        if self.t.checkpoint.enabled and stop is None and p.step > p.start_step and \
                not (m.checkpoints and m.checkpoints[-1]["step"] == p.step):
            self.save(p, "final")
        if held is not None and stop is None and not (m.evals and m.evals[-1]["step"] == p.step):
            self.evaluate(held, p)
        if self.ledger:
            self.ledger.close()
        return self.report(p, elapsed, stop, len(data))

    def start_sampler(self, p: Progress):
        mon = self.t.monitor
        if not mon.enabled:
            return None
        from .monitor import Sampler
        from .train import hostname

        return Sampler(mon.interval_seconds, self.b.rank, getattr(self.b, "device", "cpu"),
                       mon.prometheus_dir, self.job.name, hostname()).start(p)

    def train_epoch(self, data, sharder: Sharder, p: Progress, policy: Policy) -> str | None:
        """Train from ``p.cursor`` to the end of its epoch; the stop reason, if stopped.

        A step's time runs from the end of the previous step to the end of this one: the
        loop's bookkeeping and the ranks' votes count, a checkpoint's save is recorded with
        the checkpoint instead. Everything per micro-batch here runs on every step of every
        job, so it is kept to list appends and arithmetic."""
        m, b, clock = self.metrics, self.b, time.perf_counter
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
                m.step_times.append(now - t0)
                m.data_times.append(data_time)
                m.real.append(batch.step_real)
                m.lr.append(self.lr)
                data_time, first = 0.0, True
                stop = self.after_step(p, policy, batch.step_real)
                if stop or policy.done(p.step):
                    return stop
                t0 = clock() if self.saved_step == p.step else now
            fetch0 = clock()
        return None

    def settle_losses(self) -> None:
        """Move the pending micro-batch losses into ``loss_sums`` as floats, one per step."""
        m = self.metrics
        if not m.pending:
            return
        values = self.b.losses_to_floats(m.pending)
        k = self.t.grad_accumulation
        m.loss_sums.extend(float(sum(values[i:i + k])) for i in range(0, len(values), k))
        m.pending.clear()

    def set_rate(self, p: Progress, sharder: Sharder, n: int) -> None:
        """The schedule's rate for the step about to run (set only when it changes)."""
        s = self.t.schedule
        if self.lr is not None and s.decay == "constant" and p.cursor.epoch >= s.warmup_epochs:
            return   # past any warm-up a constant schedule has nothing to compute
        end = min(p.cursor.consumed + sharder.step_slots, n)
        rate = learning_rate(self.t.schedule, self.t.lr, self.b.size, p.cursor.epoch + end / n,
                             self.epochs)
        if rate != self.lr:
            self.b.set_lr(rate)
            self.lr = rate

    def after_step(self, p: Progress, policy: Policy, step_real: int) -> str | None:
        stop = None
        save = False
        if self.timeline is not None:
            self.timeline.step(p.step)
        if self.poll is not None and p.step > self.poll_step:
            # The vote posted after the previous step went with this step's gradients.
            result = vote.decode(self.b.poll_result(self.poll), self.b.size)
            self.poll = None
            stop = "preempted" if result.stop else None
            save = result.stop or result.save
            policy.agreed(self.poll_step, result.interval)
            if self.b.rank == 0 and time.monotonic() - self.progress_at >= PROGRESS_SECONDS:
                self.write_progress(*self.poll_at, result.loss_sum / self.poll_at[2])
        if stop is None and self.poll is None and policy.poll_due(p.step):
            self.settle_losses()
            wants_stop = self.flag.raised or self.time_limit_near(policy)
            if wants_stop and self.noticed_step is None:
                self.noticed_step = p.step
            # The vote carries this step's loss sum too: progress shows the global mean.
            self.poll = self.b.poll_start(vote.encode(
                wants_stop, policy.time_to_save(time.monotonic()),
                policy.propose_interval(self.metrics.step_times),
                self.metrics.loss_sums[-1] if self.metrics.loss_sums else float("nan"),
                self.b.rank, self.b.size))
            self.poll_step = p.step
            self.poll_at = (p.step, p.cursor.epoch, step_real)
            policy.polled(p.step)
        if policy.save_due(p.step, save):
            self.save(p, self.stop_reason() if stop else "interval")
            policy.saved(time.monotonic())
        if self.b.rank == 0 and policy.log_due(time.monotonic()):
            self.settle_losses()
            log.info("step %d, epoch %d, loss %.4f, lr %.4g", p.step, p.cursor.epoch,
                     self.metrics.loss_sums[-1] / step_real, self.lr)
        if stop and self.b.rank == 0:
            log.info("stopping at step %d (%s)", p.step, self.stop_reason())
        return stop

    def time_limit_near(self, policy: Policy) -> bool:
        if self.time_limit is None:
            return False
        if not hasattr(self, "_state_bytes"):
            self._state_bytes = 3 * 4 * sum(self.b.gradient_sizes())  # parameters, 2 slots
        times = sorted(self.metrics.step_times[-20:])
        return self.time_limit.near([c["seconds"] for c in self.metrics.checkpoints],
                                    self._state_bytes, times[len(times) // 2] if times else 0.0,
                                    policy.poll_every * (times[len(times) // 2] if times else 0.0))

    def stop_reason(self) -> str:
        from .timelimit import stop_reason

        return stop_reason(self.time_limit,
                           self.t.preemption.signal_lead(self.t.checkpoint.enabled))

    def write_progress(self, step: int, epoch: int, step_real: int, loss: float | None) -> None:
        """progress.json (rank 0): ``loss`` is the step's global mean, from the vote or the
        report's gather, never this rank's share alone."""
        m = self.metrics
        self.progress_at = time.monotonic()
        recent, real = m.step_times[-50:], m.real[-50:]
        write_progress(self.run_dir, {
            "step": step, "epoch": epoch, "epochs": math.ceil(self.epochs),
            "max_steps": self.t.max_steps, "loss": loss if loss == loss else None,  # NaN: none yet
            "samples_per_s": sum(real) / sum(recent) if sum(recent) > 0 else None,
            "lr": self.lr, "attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            "time": time.time()})

    # ---------------------------------------------------------------- validation
    def evaluate(self, held, p: Progress) -> dict:
        """Loss (and accuracy for classes) over the held-out data: each rank a disjoint share,
        every sample exactly once (padding has weight 0), sums combined across ranks."""
        ev = self.t.eval
        sharder = Sharder(len(held), self.b.size, self.b.rank, ev.batch_size or self.t.batch_size,
                          self.t.seed)
        loss = correct = real = 0.0
        for batch, inputs in self.b.feed(held, list(sharder.epoch(Cursor(0, 0)))):
            batch_loss, batch_correct = self.b.eval_step(inputs)
            loss, correct, real = loss + batch_loss, correct + batch_correct, real + batch.real
        totals = np.sum(self.b.allgather_object([loss, correct, real]), axis=0)
        record = {"epoch": p.cursor.epoch, "step": p.step, "loss": float(totals[0] / totals[2]),
                  "accuracy": float(totals[1] / totals[2]) if held.classes is not None else None,
                  "samples": int(totals[2])}
        self.metrics.evals.append(record)
        if self.b.rank == 0:
            log.info("validation after epoch %d (step %d): loss %.4f%s", record["epoch"], p.step,
                     record["loss"], f", accuracy {100 * record['accuracy']:.2f}%"
                     if record["accuracy"] is not None else "")
        return record

    # ---------------------------------------------------------------- results
    def report(self, p: Progress, elapsed: float, stop: str | None, n: int) -> tuple[dict, Results | None]:
        from .train import hostname

        m = self.metrics
        checksum = self.b.checksum()
        gathered = self.b.allgather_object({
            "loss_sums": m.loss_sums, "checksum": checksum, "host": hostname(),
            "samples": m.samples, "elapsed": elapsed, "utilisation": self.utilisation,
            "noticed": self.noticed_step, "signal": self.flag.signal,
            "after_signal": time.monotonic() - self.flag.at if stop and self.flag.at else None})
        per_rank = {"rank": self.b.rank, "host": hostname(), "steps": p.step - p.start_step,
                    "samples": m.samples, "elapsed_s": elapsed, "step_time_s": m.step_times,
                    "data_time_s": m.data_times, "param_checksum": checksum}
        if self.b.rank != 0:
            return per_rank, None
        elapsed_max = max(g["elapsed"] for g in gathered)
        total = sum(g["samples"] for g in gathered)
        loss = [sum(col) / real for col, real in
                zip(zip(*(g["loss_sums"] for g in gathered)), m.real)]
        if loss:                                   # the last step, not one up to 2 s before it
            self.write_progress(p.step, p.cursor.epoch, m.real[-1], loss[-1])
        sizes = self.b.gradient_sizes()
        results = Results(
            job=self.job.name, mode="managed", status=self.stop_reason() if stop else "completed",
            stop=stop_record(self.stop_reason(), gathered, p.step, self.time_limit) if stop else {},
            backend=self.t.backend,
            model=self.t.model, world_size=self.b.size, hosts=[g["host"] for g in gathered],
            dataset_samples=n, steps=p.step - p.start_step, start_step=p.start_step,
            final_step=p.step, cursor=p.cursor.to_json(), resumed_from=p.resumed_from,
            epochs=math.ceil(self.epochs), batch_size_per_rank=self.t.batch_size,
            grad_accumulation=self.t.grad_accumulation, precision=self.t.precision,
            samples=total, elapsed_s=elapsed_max,
            samples_per_s=total / elapsed_max if elapsed_max else 0.0,
            samples_per_s_steady=steady_throughput(m.step_times, m.real),
            samples_per_s_per_rank=[g["samples"] / elapsed_max if elapsed_max else 0.0
                                    for g in gathered],
            step_time_s=step_stats(m.step_times), step_times_s=m.step_times,
            data_wait_fraction=sum(m.data_times) / max(sum(m.step_times), 1e-12),
            checkpoints=m.checkpoints, checkpoint_time_s=sum(c["seconds"] for c in m.checkpoints),
            loss=loss, lr=m.lr, eval=m.evals, param_checksums=[g["checksum"] for g in gathered],
            utilisation=[g["utilisation"] for g in gathered] if self.sampler is not None else [],
            spec_digest=self.job.digest(), versions=self.b.versions(),
            precision_seen=self.b.precision_seen(),
            gradient_tensors=len(sizes), gradient_bytes=4 * sum(sizes))
        return per_rank, results


def stop_record(reason: str, gathered: list[dict], step: int, time_limit) -> dict:
    """How a stop went, for results.json: from the ranks' notes at the report."""
    signals = [g["signal"] for g in gathered if g.get("signal")]
    after = [g["after_signal"] for g in gathered if g.get("after_signal") is not None]
    noticed = [g["noticed"] for g in gathered if g.get("noticed") is not None]
    left = time_limit.left() if time_limit is not None else None
    return {"reason": reason, "signal": signals[0] if signals else None,
            "seconds_after_signal": max(after) if after else None,
            "steps_after_notice": step - min(noticed) if noticed else None,
            "seconds_left": left}
