"""The training loop both backends share: sharding, checkpoints, preemption, metrics.

A backend (:mod:`.torch_backend`, :mod:`.tf_backend`) owns the model, the Horovod-wrapped
optimizer and the framework's data adapter; everything about *which* samples, *when* to save
and *what* to record lives here, once.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from ..errors import UserError
from ..spec import JobSpec
from .checkpoint import CheckpointError, CheckpointStore, Loaded
from .data import open_data
from .sharding import Batch, Cursor, Sharder

log = logging.getLogger(__name__)

# Ranks agree on time- and signal-driven decisions (checkpoint now, stop now) through one tiny
# allreduce posted every POLL_STEPS optimizer steps and read POLL_STEPS steps later: it runs
# alongside the gradient traffic instead of stalling a step, and every rank acts on the same
# step because every rank posts and reads at the same steps.
POLL_STEPS = 10
PREEMPTED_MARKER = "PREEMPTED"


class Backend(Protocol):
    name: str
    rank: int
    size: int
    local_rank: int

    def build(self, shape: tuple[int, ...], classes: int) -> None: ...
    def feed(self, data, batches: list[Batch]) -> Iterator[tuple[Batch, object, object, object]]: ...
    def micro_step(self, x, y, w, scale: float, last: bool) -> object: ...
    def losses_to_floats(self, losses: list) -> list[float]: ...
    def state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict]: ...
    def load_state(self, tensors: dict[str, dict[str, np.ndarray]], extra: dict) -> None: ...
    def broadcast_state(self) -> None: ...
    def broadcast_object(self, obj): ...
    def allgather_object(self, obj) -> list: ...
    def poll_start(self, values: list[int]) -> object: ...
    def poll_result(self, handle: object) -> list[int]: ...
    def checksum(self) -> str: ...
    def versions(self) -> dict: ...
    def shutdown(self) -> None: ...


@dataclass
class Progress:
    step: int = 0                    # optimizer steps done, including resumed ones
    cursor: Cursor = field(default_factory=Cursor)
    start_step: int = 0
    resumed_from: str | None = None


class StopFlag:
    """Set by a signal handler; the loop acts on it at the next step boundary."""

    def __init__(self):
        self.signal: str | None = None

    def install(self, names: list[str]) -> None:
        for name in names:
            signal.signal(getattr(signal, f"SIG{name}"), self._handler)

    def _handler(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name


def checkpoint_root(job: JobSpec, run_dir: Path) -> Path:
    if job.train.checkpoint.dir:
        return Path(job.train.checkpoint.dir).absolute()
    return run_dir.parent / "checkpoints"


def _compatible(job: JobSpec, manifest: dict, path: Path) -> None:
    """Resuming needs the same model and data; world size and batch size may change."""
    t = job.train
    want = {"backend": t.backend, "model": t.model, "data": job.to_dict()["train"]["data"],
            "seed": t.seed}
    for key, value in want.items():
        if key == "data":
            have = {k: manifest.get("data", {}).get(k) for k in ("kind", "samples", "shape", "classes", "path")}
            value = {k: value.get(k) for k in have}
        else:
            have = manifest.get(key)
        if have != value:
            raise UserError(f"{path}: written by a job with train.{key} = {have!r}, this job has "
                            f"{value!r}; use another checkpoint.dir or set checkpoint.resume: false")


def steady_throughput(step_times: list[float], real: list[int]) -> float:
    """Samples/s over the steps after warm-up (graph tracing, first allreduce negotiation):
    the first tenth of the steps, at most 10, is left out."""
    skip = min(10, len(step_times) // 10)
    seconds = sum(step_times[skip:])
    return sum(real[skip:]) / seconds if seconds else 0.0


class Trainer:
    def __init__(self, job: JobSpec, run_dir: Path, backend: Backend):
        self.job, self.run_dir, self.b = job, run_dir, backend
        self.t = job.train
        self.store = CheckpointStore(checkpoint_root(job, run_dir), self.t.checkpoint.keep)
        self.flag = StopFlag()
        self.metrics = {"step_times": [], "data_times": [], "loss_sums": [], "real": [],
                        "checkpoints": [], "samples": 0}
        self.ledger = None

    # ---------------------------------------------------------------- resume
    def restore(self) -> Progress:
        info = None
        if self.b.rank == 0 and self.t.checkpoint.resume:
            try:
                loaded = self.store.latest()
            except CheckpointError as e:  # pragma: no cover - latest() already skips bad ones
                raise UserError(str(e)) from None
            if loaded is not None:
                _compatible(self.job, loaded.manifest, loaded.path)
                self._load(loaded)
                m = loaded.manifest
                info = {"step": m["step"], "cursor": m["cursor"], "path": str(loaded.path)}
                log.info("resuming from %s (step %d)", loaded.path, m["step"])
        info = self.b.broadcast_object(info)
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
        if self.b.rank == 0:
            tensors, extra = self.b.state()
            manifest = {
                "step": p.step, "epoch": p.cursor.epoch, "cursor": p.cursor.to_json(),
                "seed": self.t.seed, "world_size": self.b.size, "batch_size": self.t.batch_size,
                "backend": self.t.backend, "model": self.t.model,
                "data": self.job.to_dict()["train"]["data"], "spec_digest": self.job.digest(),
                "job_id": os.environ.get("SLURM_JOB_ID"), "reason": reason,
                "versions": self.b.versions(), "extra": extra,
            }
            saved = self.store.save(p.step, tensors, manifest)
            self.metrics["checkpoints"].append({"step": p.step, "seconds": saved.seconds,
                                                "bytes": saved.bytes, "reason": reason,
                                                "path": str(saved.path)})
            log.info("checkpoint %s (%s, %.3fs)", saved.path, reason, saved.seconds)
        if self.ledger:
            self.ledger.flush()

    # ---------------------------------------------------------------- loop
    def run(self) -> dict:
        data = open_data(self.t.data, self.t.seed)
        self.b.build(data.shape, data.classes)
        p = self.restore()
        self.flag.install(sorted({self.t.preemption.signal, "TERM"}))
        if self.t.ledger:
            (self.run_dir / "ledger").mkdir(exist_ok=True)
            attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
            self.ledger = open(self.run_dir / "ledger" / f"rank-{self.b.rank}-attempt-{attempt}.txt", "a")
        sharder = Sharder(len(data), self.b.size, self.b.rank, self.t.batch_size, self.t.seed,
                          self.t.grad_accumulation)
        ck = self.t.checkpoint
        if self.b.rank == 0:
            log.info("training: %d ranks, %d samples, %d steps per epoch, from step %d (epoch %d, "
                     "sample %d)", self.b.size, len(data), sharder.steps_per_epoch(), p.step,
                     p.cursor.epoch, p.cursor.consumed)
        last_save = last_log = time.monotonic()
        stop_reason = None
        poll = None
        t_start = time.perf_counter()
        while p.cursor.epoch < self.t.epochs and stop_reason is None:
            if self._done(p):
                break
            batches = list(sharder.epoch(p.cursor))
            t0 = time.perf_counter()
            losses, data_time = [], 0.0
            fetch0 = time.perf_counter()
            for batch, x, y, w in self.b.feed(data, batches):
                data_time += time.perf_counter() - fetch0
                losses.append(self.b.micro_step(x, y, w, self.b.size / batch.step_real,
                                                batch.last_in_step))
                self.metrics["samples"] += batch.real
                if self.ledger:
                    real = batch.ids[batch.weights > 0]
                    self.ledger.write(f"{batch.cursor.epoch} {p.step} {' '.join(map(str, real))}\n")
                if batch.last_in_step:
                    p.step += 1
                    p.cursor = batch.cursor
                    m = self.metrics
                    m["step_times"].append(time.perf_counter() - t0)
                    m["data_times"].append(data_time)
                    m["loss_sums"].append(losses)
                    m["real"].append(batch.step_real)
                    losses, data_time = [], 0.0
                    save_now = ck.every_steps and p.step % ck.every_steps == 0
                    # Also right after the first step, so that the first vote (and, for
                    # TensorFlow, the first run of the step variant that carries it) falls
                    # inside warm-up rather than into measured training.
                    if p.step % POLL_STEPS == 0 or p.step == p.start_step + 1:
                        if poll is not None:
                            agreed = self.b.poll_result(poll)
                            if agreed[0]:
                                stop_reason = "preempted"
                            save_now = save_now or agreed[1] or agreed[0]
                        due = ck.every_minutes and time.monotonic() - last_save >= ck.every_minutes * 60
                        poll = self.b.poll_start([int(self.flag.signal is not None), int(bool(due))])
                    if save_now and ck.enabled:
                        self.save(p, "preempted" if stop_reason else "interval")
                        last_save = time.monotonic()
                    if self.b.rank == 0 and time.monotonic() - last_log > 30:
                        log.info("step %d, epoch %d, loss %.4f", p.step, p.cursor.epoch,
                                 float(sum(self.b.losses_to_floats(m["loss_sums"][-1]))) / batch.step_real)
                        last_log = time.monotonic()
                    if stop_reason or self._done(p):
                        if stop_reason and self.b.rank == 0:
                            log.info("stopping at step %d after signal %s", p.step, self.flag.signal)
                        break
                    t0 = time.perf_counter()
                fetch0 = time.perf_counter()
            if stop_reason is None and p.cursor.consumed >= len(data):
                p.cursor = Cursor(p.cursor.epoch + 1, 0)
        elapsed = time.perf_counter() - t_start
        if poll is not None:
            self.b.poll_result(poll)          # every rank posted it; every rank collects it
        if ck.enabled and stop_reason is None and p.step > p.start_step and \
                not (self.metrics["checkpoints"] and self.metrics["checkpoints"][-1]["step"] == p.step):
            self.save(p, "final")
        if self.ledger:
            self.ledger.close()
        return self._report(p, elapsed, stop_reason, len(data))

    def _done(self, p: Progress) -> bool:
        return bool(self.t.max_steps and p.step >= self.t.max_steps)

    # ---------------------------------------------------------------- results
    def _report(self, p: Progress, elapsed: float, stop_reason: str | None, n: int) -> dict:
        from .train import hostname, step_stats

        m = self.metrics
        loss_sums = [float(sum(v)) for v in
                     (self.b.losses_to_floats(group) for group in m["loss_sums"])]
        checksum = self.b.checksum()
        gathered = self.b.allgather_object({
            "loss_sums": loss_sums, "checksum": checksum, "host": hostname(),
            "samples": m["samples"], "elapsed": elapsed})
        per_rank = {"rank": self.b.rank, "host": hostname(), "steps": p.step - p.start_step,
                    "samples": m["samples"], "elapsed_s": elapsed, "step_time_s": m["step_times"],
                    "data_time_s": m["data_times"], "param_checksum": checksum}
        results = None
        if self.b.rank == 0:
            elapsed_max = max(g["elapsed"] for g in gathered)
            total = sum(g["samples"] for g in gathered)
            loss = [sum(col) / real for col, real in
                    zip(zip(*(g["loss_sums"] for g in gathered)), m["real"])]
            results = {
                "job": self.job.name, "status": stop_reason or "completed",
                "backend": self.t.backend, "model": self.t.model, "world_size": self.b.size,
                "hosts": [g["host"] for g in gathered], "dataset_samples": n,
                "steps": p.step - p.start_step, "start_step": p.start_step, "final_step": p.step,
                "cursor": p.cursor.to_json(), "resumed_from": p.resumed_from,
                "epochs": self.t.epochs, "batch_size_per_rank": self.t.batch_size,
                "grad_accumulation": self.t.grad_accumulation, "precision": self.t.precision,
                "samples": total, "elapsed_s": elapsed_max,
                "samples_per_s": total / elapsed_max if elapsed_max else 0.0,
                "samples_per_s_steady": steady_throughput(m["step_times"], m["real"]),
                "samples_per_s_per_rank": [g["samples"] / elapsed_max if elapsed_max else 0.0
                                           for g in gathered],
                "step_time_s": step_stats(m["step_times"]), "step_times_s": m["step_times"],
                "data_wait_fraction": sum(m["data_times"]) / max(sum(m["step_times"]), 1e-12),
                "checkpoints": m["checkpoints"],
                "checkpoint_time_s": sum(c["seconds"] for c in m["checkpoints"]),
                "loss": loss, "param_checksums": [g["checksum"] for g in gathered],
                "spec_digest": self.job.digest(), "versions": self.b.versions(),
            }
        return {"rank": self.b.rank, "per_rank": per_rank, "results": results}
