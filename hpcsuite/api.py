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
    if restored:                                # the model and the optimizer's moments
        api.load_torch_state(model, optimizer, restored.state)
    for batch in run.batches(len(data)):        # this rank's share, every sample once per epoch
        x, y = data[batch.ids]
        loss = step(x, y, batch.weights)        # weight 0 marks padding: leave it out of the loss
        run.log(loss=float(loss))               # once per optimizer step: results.json metrics
        if run.should_stop():                   # all ranks agree: a preemption signal came
            run.save(api.torch_state(model, optimizer))
            break
        if run.checkpoint_due():
            run.save(api.torch_state(model, optimizer))
    run.finish(params=api.torch_state(model)["model"])   # results.json; preempted runs requeue

Keras 3: ``api.keras_state(model, optimizer)`` and ``api.load_keras_state(model, optimizer,
restored.state)`` (the optimizer's variables: iterations, moments, its learning rate).

Everything here is collective where it says so: every rank must call ``restore``,
``should_stop``, ``finish`` (and iterate ``batches``) the same number of times.

Outside a job (trying a script by hand, one process): ``HPCSUITE_SPEC=job.yaml python
train.py``, or ``api.Run(hvd, spec="job.yaml")``, resolves the spec through the site, user and
project profiles the way ``hpcsuite submit`` would and runs it here, in
``OUTPUT_DIR/NAME/local/TIME`` (checkpoints in ``OUTPUT_DIR/NAME/local/checkpoints``, so a
second try resumes the first, and a Slurm job's checkpoints are never touched).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import UserError
from .results import Results, step_stats, write_json_atomic
from .runtime.sharding import Batch
from .spec import JobSpec

log = logging.getLogger("hpcsuite.api")

__all__ = ["Run", "Restored", "Batch", "torch_state", "load_torch_state", "keras_state",
           "load_keras_state"]

PROGRESS_SECONDS = 2.0   # rank 0 rewrites progress.json at most this often

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
    ``horovod.tensorflow`` module (None: a single process, for trying a script by hand).

    The job is, first found first: ``job``; the one hpcsuite launched this rank in
    (``HPCSUITE_JOB``, or ``job.json`` in ``run_dir``/``HPCSUITE_RUN_DIR``); outside a job,
    ``spec`` (or ``HPCSUITE_SPEC``), a job spec resolved here and run in this process. With
    none of them it stops the script with one line saying how to run it (exit 2)."""

    def __init__(self, hvd=None, job: JobSpec | None = None, run_dir: str | Path | None = None,
                 spec: str | Path | None = None):
        global _ACTIVE
        from .runtime.loop import VOTE_SECONDS, Policy, checkpoint_root
        from .runtime.checkpoint import CheckpointStore
        from .runtime.sharding import Cursor
        from .runtime.signals import FLAG

        self.hvd = hvd or _Single()
        self.rank, self.size = int(self.hvd.rank()), int(self.hvd.size())
        self.job, self.run_dir = _find_job(self.hvd, job, run_dir, spec)
        job = self.job
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
        epochs = epochs or self.t.epoch_limit(sharder.steps_per_epoch())
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
        metrics = {k: list(v) for k, v in self._metrics.items()}   # every run.log() series
        results = Results(
            job=self.job.name, mode="script", status=status, backend=self.t.backend,
            stop=stop_record(status, gathered, self.step, self._time_limit)
            if status in ("preempted", "time_limit") else {},
            model=self.t.script, world_size=self.size, hosts=[g["host"] for g in gathered],
            dataset_samples=self._n or 0, steps=self.step - self.start_step,
            start_step=self.start_step, final_step=self.step, cursor=self.cursor.to_json(),
            resumed_from=self.resumed_from, epochs=self.t.epochs or 1,
            batch_size_per_rank=self.t.batch_size, grad_accumulation=self.t.grad_accumulation,
            precision=self.t.precision, samples=total, elapsed_s=elapsed_max,
            samples_per_s=total / elapsed_max if elapsed_max else 0.0,
            samples_per_s_steady=steady_throughput(self._step_times, self._real[:len(self._step_times)]),
            samples_per_s_per_rank=[g["samples"] / elapsed_max if elapsed_max else 0.0 for g in gathered],
            step_time_s=step_stats(self._step_times), step_times_s=self._step_times,
            checkpoints=self._checkpoints,
            checkpoint_time_s=sum(c["seconds"] for c in self._checkpoints),
            loss=list(metrics.get("loss", [])), param_checksums=[g["checksum"] for g in gathered
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


def _find_job(hvd, job: JobSpec | None, run_dir, spec) -> tuple[JobSpec, Path]:
    """The job this rank runs and its run directory (see :class:`Run`)."""
    from .runtime.train import load_job

    run_dir = run_dir or os.environ.get("HPCSUITE_RUN_DIR")
    if job is not None:
        return job, Path(run_dir or ".").absolute()
    named = os.environ.get("HPCSUITE_JOB")
    if named:
        return load_job(named), Path(run_dir or Path(named).parent).absolute()
    if run_dir:
        return load_job(str(Path(run_dir) / "job.json")), Path(run_dir).absolute()
    spec = spec or os.environ.get("HPCSUITE_SPEC")
    if not spec and Path("job.json").is_file():
        return load_job("job.json"), Path(".").absolute()
    try:
        if not spec:
            script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "train.py"
            raise UserError(
                f"hpcsuite.api.Run: not inside an hpcsuite job (no HPCSUITE_JOB, no job.json "
                f"in {Path.cwd()}): submit it with `hpcsuite submit SPEC.yaml` (train.script: "
                f"{script}), or try it here in one process with `HPCSUITE_SPEC=SPEC.yaml python "
                f"{script}` (or api.Run(hvd, spec='SPEC.yaml'))")
        return _local_job(hvd, str(spec))
    except UserError as e:        # the script runs by hand: its user gets one line, no traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(UserError.exit_code) from None


def _local_job(hvd, spec: str) -> tuple[JobSpec, Path]:
    """``spec`` resolved as ``hpcsuite submit`` would (profiles, locks), run in this process:
    a run directory of its own under OUTPUT_DIR/NAME/local/, with the resolved job.json."""
    import datetime as dt

    from .config import resolve

    if not Path(spec).is_file():
        raise UserError(f"{spec}: no such file (HPCSUITE_SPEC or api.Run(spec=...): the job spec "
                        "to try this script with)")
    job = resolve(spec).job
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    stamp = hvd.broadcast_object(stamp, root_rank=0, name="hpcsuite.api.local")
    run_dir = (Path(job.output_dir) / job.name / "local" / stamp).absolute()
    if int(hvd.rank()) == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "job.json", job.to_dict())
        log.warning("not in a Slurm job: running %s in this process (%d rank%s), outputs in %s",
                    spec, int(hvd.size()), "s" if int(hvd.size()) != 1 else "", run_dir)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
    return job, run_dir


def _checksum(params: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(params[name])).tobytes())
    return h.hexdigest()


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


def job_spec_json() -> dict:
    """The resolved job spec as JSON (what every rank read), for scripts that want the dict."""
    return json.loads(Path(os.environ.get("HPCSUITE_JOB", "job.json")).read_text())


# -------------------------------------------------------------------- framework state helpers
# What run.save() takes and Restored.state gives back: {group: {name: numpy array}}. The
# frameworks are imported here only, when a script calls these.

def torch_state(model, optimizer=None) -> dict[str, dict[str, np.ndarray]]:
    """``{"model": ..., "optimizer": ...}`` of a torch module and optimizer, as numpy arrays:
    the model's state_dict, the optimizer's per-parameter state (``state.I.KEY``: moments, step
    counts) and its numeric hyperparameters (``group.G.KEY``: lr, betas, ...; a scheduler's
    changes survive the restart)."""
    import torch

    def array(t):
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    out = {"model": {k: array(v) for k, v in model.state_dict().items()}}
    if optimizer is not None:
        sd = optimizer.state_dict()
        optim = {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                optim[f"state.{idx}.{key}"] = array(value) if torch.is_tensor(value) else np.asarray(value)
        for g, group in enumerate(sd["param_groups"]):
            for key, value in group.items():
                if key != "params" and _numeric(value):
                    optim[f"group.{g}.{key}"] = np.asarray(value, dtype=np.float64)
        out["optimizer"] = optim
    return out


def _numeric(value) -> bool:
    items = value if isinstance(value, (tuple, list)) else [value]
    return bool(items) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items)


def load_torch_state(model, optimizer, state: dict) -> None:
    """Put ``torch_state(model, optimizer)`` (from ``restored.state``) back; ``optimizer``
    may be None. A checkpoint of another model or optimizer is a UserError naming the key."""
    import torch

    params = {k: torch.from_numpy(np.array(v)) for k, v in _group(state, "model").items()}
    try:
        model.load_state_dict(params, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise UserError(f"checkpoint: model: does not fit this model ({' '.join(first[:2])})") from None
    if optimizer is None:
        return
    current = optimizer.state_dict()
    groups = [dict(g) for g in current["param_groups"]]
    per_param: dict[int, dict] = {}
    for name, value in _group(state, "optimizer").items():
        kind, index, key = (name.split(".", 2) + ["", ""])[:3]
        if kind == "state" and index.isdigit():
            per_param.setdefault(int(index), {})[key] = torch.from_numpy(np.array(value))
        elif kind == "group" and index.isdigit() and int(index) < len(groups) and key:
            was, value = groups[int(index)].get(key), np.asarray(value)
            if isinstance(was, (tuple, list)) or value.ndim:
                groups[int(index)][key] = type(was or ())(float(x) for x in value.ravel())
            else:    # the type it has here (int, float), or a float (a scheduler's initial_lr)
                groups[int(index)][key] = type(was)(value) if isinstance(was, (int, float)) \
                    else float(value)
        else:
            raise UserError(f"checkpoint: optimizer.{name}: not a state of this optimizer "
                            f"({type(optimizer).__name__} with {len(groups)} parameter group(s))")
    count = sum(len(g["params"]) for g in groups)
    if per_param and max(per_param) >= count:
        raise UserError(f"checkpoint: optimizer: state for parameter {max(per_param)}, this "
                        f"optimizer has {count}")
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})


def keras_state(model, optimizer=None) -> dict[str, dict[str, np.ndarray]]:
    """``{"model": ..., "optimizer": ...}`` of a Keras 3 model and optimizer by variable path
    (the optimizer's iterations, moments and learning rate are its ``variables``)."""
    out = {"model": _by_path(model.variables, "model")}
    if optimizer is not None:
        out["optimizer"] = _by_path(optimizer.variables, "optimizer")
    return out


def load_keras_state(model, optimizer, state: dict) -> None:
    """Assign ``keras_state(model, optimizer)`` (from ``restored.state``) back; builds the
    optimizer on the model's trainable variables first when it has not been built."""
    groups = [("model", model.variables)]
    if optimizer is not None:
        if not getattr(optimizer, "built", True):
            optimizer.build(model.trainable_variables)
        groups.append(("optimizer", optimizer.variables))
    for group, variables in groups:
        saved = _group(state, group)
        names = [v.path for v in variables]
        missing, unknown = sorted(set(names) - set(saved)), sorted(set(saved) - set(names))
        if missing or unknown:
            raise UserError(f"checkpoint: {group}: variables differ from this {group}'s "
                            f"(missing {missing[:3]}, unexpected {unknown[:3]})")
        for v in variables:
            if tuple(saved[v.path].shape) != tuple(v.shape):
                raise UserError(f"checkpoint: {group}.{v.path}: shape {list(saved[v.path].shape)}, "
                                f"this {group} has {list(v.shape)}")
            v.assign(saved[v.path])


def _by_path(variables, group: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for v in variables:
        if v.path in out:
            raise UserError(f"{group}: two variables named {v.path!r}: give the layers "
                            "distinct names to checkpoint them")
        out[v.path] = np.asarray(v.numpy())
    return out


def _group(state: dict, group: str) -> dict:
    """``state[group]`` ({name: array}); the optimizer group may be absent (nothing to load)."""
    if not isinstance(state, dict) or not isinstance(state.get(group, {}), dict):
        raise UserError(f"checkpoint: expected {{{group!r}: {{name: array}}}} (what "
                        "torch_state/keras_state make)")
    if group != "optimizer" and group not in state:
        raise UserError(f"checkpoint: no {group!r} group (it holds {sorted(state)})")
    return state.get(group, {})
