"""hpcsuite.api: what your own Horovod training script gets from hpcsuite (script mode).

With ``train.script: train.py`` in the job spec, the template launches ``train.py`` on every
rank, with the job's environment, Horovod knobs, signal forwarding and run directory. The
script brings its own model and loop; this module gives it the parts that make a job safe to
stop and resume, framework-neutral (it only needs the ``horovod.torch`` or
``horovod.tensorflow`` module the script already initialised)::

    import horovod.torch as hvd
    from hpcsuite import api

    hvd.init()
    run = api.Run(hvd)                          # the job: spec, run directory, rank, size
    restored = run.restore()                    # the latest good checkpoint, on every rank
    if restored:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in restored.state["model"].items()})
    for batch in run.batches(len(data)):        # this rank's share, every sample once per epoch
        x, y = data[batch.ids]
        loss = step(x, y, batch.weights)        # weight 0 marks padding: leave it out of the loss
        run.log(loss=float(loss))               # once per optimizer step
        if run.should_stop():                   # all ranks agree: a preemption signal came
            run.save({"model": numpy_state(model)})
            break
        if run.checkpoint_due():
            run.save({"model": numpy_state(model)})
    run.finish(params=numpy_state(model))       # results.json; preempted runs requeue

Everything here is collective where it says so: every rank must call ``restore``,
``should_stop``, ``finish`` (and iterate ``batches``) the same number of times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import UserError
from .results import Results, step_stats, write_json_atomic

PROGRESS_SECONDS = 2.0   # rank 0 rewrites progress.json at most this often
from .spec import JobSpec

log = logging.getLogger("hpcsuite.api")

__all__ = ["Run", "Restored", "Batch"]

_ACTIVE: "Run | None" = None


@dataclass(frozen=True)
class Restored:
    step: int                                   # optimizer steps done before the checkpoint
    state: dict[str, dict[str, np.ndarray]]     # what run.save() was given
    extra: dict                                 # JSON-able extras given to run.save()
    path: str


class _Single:
    """Stand-in for a Horovod module outside a job (one process): for trying a script."""

    @staticmethod
    def rank():
        return 0

    @staticmethod
    def size():
        return 1

    @staticmethod
    def broadcast_object(obj, root_rank=0, name=None):
        return obj

    @staticmethod
    def allgather_object(obj, name=None):
        return [obj]


class Run:
    """This rank's view of the job. ``hvd``: the initialised ``horovod.torch`` or
    ``horovod.tensorflow`` module (None: a single process, for trying a script by hand)."""

    def __init__(self, hvd=None, job: JobSpec | None = None, run_dir: str | Path | None = None):
        global _ACTIVE
        from .runtime.loop import VOTE_SECONDS, Policy, checkpoint_root
        from .runtime.checkpoint import CheckpointStore
        from .runtime.sharding import Cursor
        from .runtime.signals import FLAG

        self.hvd = hvd or _Single()
        self.rank, self.size = int(self.hvd.rank()), int(self.hvd.size())
        self.run_dir = Path(run_dir or os.environ.get("HPCSUITE_RUN_DIR") or ".").absolute()
        if job is None:
            path = os.environ.get("HPCSUITE_JOB") or str(self.run_dir / "job.json")
            from .runtime.train import load_job
            job = load_job(path)
        self.job = job
        self.t = job.train
        self.args = list(self.t.args)
        self.step = 0
        self.start_step = 0
        self.cursor = Cursor()
        self.resumed_from: str | None = None
        self.store = CheckpointStore(checkpoint_root(job, self.run_dir), self.t.checkpoint.keep)
        self._policy = Policy(job, 0, time.monotonic())
        self.vote_seconds = VOTE_SECONDS     # the ranks vote on stopping about this often
        self._flag = FLAG
        self._calls = 0
        self._next_vote = 1
        self._call_times: list[float] = []
        self._last_call = time.perf_counter()
        self._save_agreed = False
        self._stopped = False
        self._metrics: dict[str, list[float]] = {}
        self._step_times: list[float] = []
        self._real: list[int] = []
        self._samples = 0
        self._last = time.perf_counter()
        self._t0 = time.perf_counter()
        self._checkpoints: list[dict] = []
        self._n: int | None = None
        self._finished = False
        self._progress_at = float("-inf")
        self._timeline = None          # train.monitor.timeline_steps: made at the first log()
        self._time_limit = None        # rank 0 stops before Slurm's time limit by its clock
        if self.rank == 0 and self.t.preemption.watches_time_limit(self.t.checkpoint.enabled):
            from .runtime.timelimit import TimeLimit
            self._time_limit = TimeLimit.from_slurm()
        self._noticed: int | None = None
        self._stop_reason = "preempted"
        _ACTIVE = self

    # ---------------------------------------------------------------- resume
    def restore(self) -> Restored | None:
        """The latest good checkpoint of this job (collective). Rank 0 picks it and checks it
        was written by the same script; every rank reads it; progress continues from it."""
        from .runtime.sharding import Cursor

        choice = None
        if self.rank == 0 and self.t.checkpoint.resume:
            try:
                loaded = self.store.latest()
                if loaded is not None:
                    wrote = loaded.manifest.get("script")
                    if wrote != self.t.script:
                        raise UserError(f"{loaded.path}: written by train.script {wrote!r}, this "
                                        f"job runs {self.t.script!r}; use another checkpoint.dir")
                    choice = str(loaded.path)
            except UserError as e:     # every rank stops on it, none waits for rank 0
                choice = {"error": str(e)}
        choice = self.hvd.broadcast_object(choice, root_rank=0, name="hpcsuite.api.restore")
        if isinstance(choice, dict):
            raise UserError(choice["error"])
        if choice is None:
            return None
        loaded = self.store.load(Path(choice))
        m = loaded.manifest
        self.step = self.start_step = int(m["step"])
        self.cursor = Cursor.from_json(m["cursor"])
        self._policy = self._new_policy()
        self.resumed_from = choice
        if self.rank == 0:
            log.info("resuming from %s (step %d)", choice, self.step)
        return Restored(self.step, loaded.tensors, m.get("extra", {}), choice)

    def _new_policy(self):
        from .runtime.loop import Policy

        return Policy(self.job, self.start_step, time.monotonic())

    # ---------------------------------------------------------------- data
    def batches(self, n: int, batch_size: int | None = None, epochs: int | None = None,
                accumulation: int | None = None) -> Iterator:
        """This rank's micro-batches of ``n`` samples, from where the job is (after a restore:
        where the checkpoint left off) to the end of ``epochs`` (default train.epochs), at most
        train.max_steps steps. Each batch has ``ids`` (sample ids), ``weights`` (0 for padding),
        ``real``, ``last_in_step`` and ``epoch``. A batch counts as done once handed out:
        finish its step before calling save()."""
        from .runtime.sharding import Cursor, Sharder

        self._n = n
        sharder = Sharder(n, self.size, self.rank, batch_size or self.t.batch_size, self.t.seed,
                          accumulation or self.t.grad_accumulation)
        epochs = epochs or self.t.epochs
        while self.cursor.epoch < epochs:
            for batch in sharder.epoch(self.cursor):
                if self.t.max_steps and self.step >= self.t.max_steps:
                    return
                self._samples += batch.real
                if batch.last_in_step:
                    self.step += 1
                    self.cursor = batch.cursor
                    self._real.append(batch.step_real)
                yield batch
                if self._stopped:
                    return
            self.cursor = Cursor(self.cursor.epoch + 1, 0)

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    # ---------------------------------------------------------------- recording
    def log(self, **metrics: float) -> None:
        """Record this optimizer step: its time (since the previous call) and the script's
        numbers (loss, accuracy, ...), which reach results.json."""
        now = time.perf_counter()
        self._step_times.append(now - self._last)
        self._last = now
        for key, value in metrics.items():
            self._metrics.setdefault(key, []).append(float(value))
        mon = self.t.monitor
        if mon.timeline_steps and hasattr(self.hvd, "start_timeline"):
            if self._timeline is None:
                from .runtime.timeline import Window

                self._timeline = Window(self.hvd, self.rank, self.run_dir,
                                        mon.timeline_start_step, mon.timeline_steps)
            self._timeline.step(self.step)
        if self.rank == 0 and time.monotonic() - self._progress_at >= PROGRESS_SECONDS:
            self._write_progress(metrics)
        if self.rank == 0 and self._policy.log_due(time.monotonic()):
            shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            log.info("step %d, epoch %d%s", self.step, self.cursor.epoch, f", {shown}" if shown else "")

    def _write_progress(self, metrics: dict) -> None:
        from .results import write_progress

        self._progress_at = time.monotonic()
        times, real = self._step_times[-50:], self._real[-50:]
        rate = sum(real[-len(times):]) / sum(times) if times and real and sum(times) > 0 else None
        write_progress(self.run_dir, {
            "step": self.step, "epoch": self.cursor.epoch, "max_steps": self.t.max_steps,
            "samples_per_s": rate, "loss": float(metrics["loss"]) if "loss" in metrics else None,
            "metrics": {k: float(v) for k, v in metrics.items()},
            "attempt": int(os.environ.get("SLURM_RESTART_COUNT", "0")), "time": time.time()})

    # ---------------------------------------------------------------- stopping and saving
    def should_stop(self) -> bool:
        """True on every rank at the same call once any rank got the preemption signal
        (collective: call it once per optimizer step on every rank). The ranks vote about
        every ``vote_seconds`` (at least every step when steps are slower than that), so a
        stop takes effect within one interval."""
        from .runtime.loop import Policy

        self._calls += 1
        now = time.perf_counter()
        self._call_times.append(now - self._last_call)
        self._last_call = now
        if self._stopped:
            return True
        if self._calls < self._next_vote:
            return False
        wants = self._flag.raised or self._time_limit_near()
        if wants and self._noticed is None:
            self._noticed = self.step
        votes = self.hvd.allgather_object(
            [int(wants), int(self._policy.time_to_save(time.monotonic())),
             Policy.propose_interval(self._call_times[1:] or self._call_times, self.vote_seconds)],
            name="hpcsuite.api.poll")
        self._next_vote = self._calls + min(v[2] for v in votes)   # the same on every rank
        self._save_agreed = any(v[1] for v in votes)
        if any(v[0] for v in votes):
            self._stopped = True
            if self.rank == 0:
                self._stop_reason = self._reason()
                log.info("stopping at step %d (%s)", self.step, self._stop_reason)
        return self._stopped

    def _time_limit_near(self) -> bool:
        if self._time_limit is None:
            return False
        times = sorted(self._call_times[-20:])
        median = times[len(times) // 2] if times else 0.0
        return self._time_limit.near([c["seconds"] for c in self._checkpoints], 0, median,
                                     self.vote_seconds)

    def _reason(self) -> str:
        from .runtime.timelimit import stop_reason

        return stop_reason(self._time_limit,
                           self.t.preemption.signal_lead(self.t.checkpoint.enabled))

    def checkpoint_due(self) -> bool:
        """Whether this step should be saved: every train.checkpoint.every_steps, or when the
        ranks' last vote found every_minutes passed (the same answer on every rank)."""
        due = self._policy.save_due(self.step, self._save_agreed)
        self._save_agreed = False
        return due

    def save(self, state: dict, extra: dict | None = None, reason: str | None = None) -> str | None:
        """Save ``state`` (``{group: {name: array}}`` or ``{name: array}``) as this step's
        checkpoint, with the data position, atomically; rank 0 writes, other ranks return None."""
        if state and all(not isinstance(v, dict) for v in state.values()):
            state = {"state": state}
        reason = reason or (self._stop_reason if self._stopped else "interval")
        self._policy.saved(time.monotonic())
        if self.rank != 0:
            return None
        tensors = {g: {k: np.asarray(v) for k, v in arrays.items()} for g, arrays in state.items()}
        manifest = {"step": self.step, "epoch": self.cursor.epoch, "cursor": self.cursor.to_json(),
                    "world_size": self.size, "script": self.t.script, "seed": self.t.seed,
                    "spec_digest": self.job.digest(), "reason": reason,
                    "job_id": os.environ.get("SLURM_JOB_ID"), "extra": extra or {}}
        saved = self.store.save(self.step, tensors, manifest)
        self._checkpoints.append({"step": self.step, "seconds": saved.seconds, "bytes": saved.bytes,
                                  "reason": reason, "path": str(saved.path)})
        log.info("checkpoint %s (%s, %.3fs)", saved.path, reason, saved.seconds)
        return str(saved.path)

    # ---------------------------------------------------------------- results
    def finish(self, params: dict | None = None, status: str | None = None, **extra) -> None:
        """Write this rank's record and, on rank 0, results.json (collective). ``params``:
        the model's arrays, whose checksum shows the ranks ended identical."""
        if self._finished:
            return
        self._finished = True
        from .runtime.loop import steady_throughput, stop_record
        from .runtime.train import hostname, write_stop_marker

        status = status or (self._stop_reason if self._stopped else "completed")
        elapsed = time.perf_counter() - self._t0
        if self._timeline is not None:
            self._timeline.close(self.step)
        checksum = _checksum(params) if params is not None else None
        mine = {"rank": self.rank, "host": hostname(), "samples": self._samples,
                "elapsed": elapsed, "checksum": checksum, "metrics": self._metrics,
                "noticed": self._noticed, "signal": self._flag.signal,
                "after_signal": time.monotonic() - self._flag.at
                if self._stopped and self._flag.at else None}
        write_json_atomic(self.run_dir / f"rank-{self.rank}.json",
                          {**mine, "steps": self.step - self.start_step, "step_time_s": self._step_times})
        gathered = self.hvd.allgather_object(mine, name="hpcsuite.api.finish")
        if self.rank != 0:
            return
        if self._step_times:       # the last step, not one up to 2 s before it
            self._write_progress({k: v[-1] for k, v in self._metrics.items() if v})
        elapsed_max = max(g["elapsed"] for g in gathered)
        total = sum(g["samples"] for g in gathered)
        metrics = {k: v for k, v in self._metrics.items()}
        results = Results(
            job=self.job.name, mode="script", status=status, backend=self.t.backend,
            stop=stop_record(status, gathered, self.step, self._time_limit)
            if status in ("preempted", "time_limit") else {},
            model=self.t.script, world_size=self.size, hosts=[g["host"] for g in gathered],
            dataset_samples=self._n or 0, steps=self.step - self.start_step,
            start_step=self.start_step, final_step=self.step, cursor=self.cursor.to_json(),
            resumed_from=self.resumed_from, epochs=self.t.epochs,
            batch_size_per_rank=self.t.batch_size, grad_accumulation=self.t.grad_accumulation,
            precision=self.t.precision, samples=total, elapsed_s=elapsed_max,
            samples_per_s=total / elapsed_max if elapsed_max else 0.0,
            samples_per_s_steady=steady_throughput(self._step_times, self._real[:len(self._step_times)]),
            samples_per_s_per_rank=[g["samples"] / elapsed_max if elapsed_max else 0.0 for g in gathered],
            step_time_s=step_stats(self._step_times), step_times_s=self._step_times,
            checkpoints=self._checkpoints,
            checkpoint_time_s=sum(c["seconds"] for c in self._checkpoints),
            loss=metrics.pop("loss", []), param_checksums=[g["checksum"] for g in gathered
                                                          if g["checksum"] is not None],
            spec_digest=self.job.digest(), metrics={**metrics, **extra})
        if params is not None:                  # what the script's allreduce carries, at best
            results.gradient_tensors = len(params)
            results.gradient_bytes = 4 * sum(int(np.asarray(v).size) for v in params.values())
        results.job_id = os.environ.get("SLURM_JOB_ID")
        results.attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        results.versions = _versions()
        path = results.write(self.run_dir)
        write_stop_marker(self.run_dir, status, self.step)
        print(f"hpcsuite script: {status} at step {self.step}; wrote {path}", flush=True)


def _checksum(params: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(params[name])).tobytes())
    return h.hexdigest()


def _versions() -> dict:
    import sys

    out = {"python": sys.version.split()[0], "numpy": np.__version__}
    for name in ("torch", "tensorflow", "horovod"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", None)
    return out


def active() -> Run | None:
    """The Run a script created (script mode finishes it if the script did not)."""
    return _ACTIVE


def job_spec_json() -> dict:
    """The resolved job spec as JSON (what every rank read), for scripts that want the dict."""
    return json.loads(Path(os.environ.get("HPCSUITE_JOB", "job.json")).read_text())
