"""The results file a job leaves behind (``results.json``), its typed owner, and its summary.

Framework-free: the managed loop and script mode write it, ``submit --wait``, ``status`` and
the tests read it, all through :class:`Results`. Every key has a default, so a results file
from an older hpcsuite (or from a script that records little) still reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import count
from .rundir import RunDir, failure_text
# the run directory's names, for modules that take them from here (hpcsuite.runs.rundir owns them)
from .rundir import PROGRESS, RESULTS  # noqa: F401


def umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread, while
    it reads it): the site's and the user's choice of who may read and write their files."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, data: object, durable: bool = True) -> None:
    """Write JSON so readers see the old file or the new one, never half of one: the one way
    hpcsuite writes a JSON file. ``durable=False`` skips the fsync, for a file replaced every
    few seconds whose last version a crash may lose (progress.json)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~umask())   # mkstemp's 0600: the mode a plain open would give
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def mark_failed(marker: Path, rank: int, code: int, text: str, **tags: str | None) -> bool:
    """Create an attempt's FAILED marker (:func:`hpcsuite.runs.rundir.failure_text`) unless
    another rank made it first: False then. In one write, so no reader sees half of it; a
    marker that cannot be written (True: this rank still reports first) loses only the file."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(failure_text(rank, code, text, **tags))
    except FileExistsError:
        return False
    except OSError:
        pass
    return True


def write_progress(run_dir: Path, progress: dict) -> None:
    """Rank 0's latest step, epoch, throughput and loss while a job runs (``status``,
    ``submit --wait``): replaced whole every few seconds, never fsynced (losing the last one
    in a crash loses nothing that matters)."""
    try:
        write_json_atomic(RunDir(run_dir).progress, progress, durable=False)
    except OSError:
        pass                          # progress is a convenience: training goes on


def read_progress(run_dir: str | Path) -> dict | None:
    """The job's latest progress record, or None (none yet, or caught mid-replace)."""
    path = RunDir(run_dir).progress
    try:
        data = json.loads(path.read_text())
    except PermissionError:
        from ..errors import permission_denied

        raise permission_denied(path) from None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Results:
    job: str = ""
    mode: str = "managed"                  # managed loop or script
    status: str = "completed"              # completed | preempted | time_limit
    # why and how fast a stopped run stopped: reason (signal, time_limit), signal,
    # seconds_after_signal (the signal to the agreed stop), steps_after_notice, seconds_left
    stop: dict = field(default_factory=dict)
    job_id: str | None = None
    attempt: int = 0
    backend: str | None = None
    model: str | None = None
    world_size: int = 1
    hosts: list[str] = field(default_factory=list)
    dataset_samples: int = 0
    steps: int = 0                         # optimizer steps in this attempt
    start_step: int = 0
    final_step: int = 0
    cursor: dict = field(default_factory=dict)
    resumed_from: str | None = None
    # resumed on another number of ranks (runs/world_change.py): from_ranks, to_ranks, step,
    # global_batch_before, global_batch_after; {} when the world is the one that saved
    world_change: dict = field(default_factory=dict)
    epochs: int = 0
    batch_size_per_rank: int = 0
    grad_accumulation: int = 1
    precision: str | None = None
    # what the training steps computed in: {compute_dtype, param_dtype, loss_scaling}
    precision_seen: dict = field(default_factory=dict)
    samples: int = 0
    elapsed_s: float = 0.0
    samples_per_s: float = 0.0
    samples_per_s_steady: float = 0.0
    samples_per_s_per_rank: list[float] = field(default_factory=list)
    step_time_s: dict = field(default_factory=dict)     # count, mean, median, p90, min, max
    step_times_s: list[float] = field(default_factory=list)
    data_wait_fraction: float = 0.0
    checkpoints: list[dict] = field(default_factory=list)   # step, seconds, bytes, reason, path
    checkpoint_time_s: float = 0.0
    loss: list[float] = field(default_factory=list)         # mean loss of each step
    lr: list[float] = field(default_factory=list)           # learning rate of each step
    eval: list[dict] = field(default_factory=list)          # epoch, step, loss, accuracy, samples
    param_checksums: list[str] = field(default_factory=list)
    # train.monitor: per rank, samples of {t, step, cpu_percent, rss_bytes[, gpu_percent,
    # gpu_memory_bytes]} over the run (t: seconds since training began)
    utilisation: list[list[dict]] = field(default_factory=list)
    # train.monitor on GPUs (NVML's energy counter, training's start to its end): each rank's
    # joules (None: its GPU did not say), their sum, and samples per joule (all ranks said)
    energy_j_per_rank: list = field(default_factory=list)
    energy_j: float | None = None
    samples_per_joule: float | None = None
    # each rank's own time (data, forward, backward, optimizer) and allreduce wait per step,
    # means over the attempt (own_s, wait_s: lists by rank, None where not measured), and the
    # rank the others waited for, if one was named (runs/stragglers.py): slow_rank
    rank_balance: dict = field(default_factory=dict)
    gradient_tensors: int = 0                               # tensors one step allreduces
    gradient_bytes: int = 0                                 # their size in float32
    spec_digest: str | None = None
    versions: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)             # script mode: the script's own
    # one summary per attempt of this job that wrote results (each attempt's whole record is
    # results-attempt-N.json beside this file): attempt, status, start/final step, samples, ...
    attempts: list[dict] = field(default_factory=list)
    # the whole job, every attempt joined by step (a later attempt's step replaces an earlier
    # one's): steps, loss and samples_per_s (global batch / step time) per step, and
    # attempt_starts: [{attempt, step (its first), status, world_size, samples_per_s, ...}]
    history: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict, source: str = "results") -> "Results":
        """Known keys, each checked against the type of its default (TypeError naming the key
        otherwise); unknown keys are ignored (a newer hpcsuite wrote them)."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            want = {list: list, dict: dict, bool: bool, int: int, float: (int, float),
                    str: str}.get(type(default))
            if f.type == "float | None":
                want = (int, float)
            if value is not None and want is not None and (not isinstance(value, want) or
                                                           isinstance(value, bool) and want is not bool):
                raise TypeError(f"{f.name}: expected {getattr(want, '__name__', 'a number')}, got "
                                f"{type(value).__name__}")
            if value is None and default is not None:
                raise TypeError(f"{f.name}: must not be null")
            values[f.name] = value
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> "Results":
        from ..errors import UserError

        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except PermissionError:
            from ..errors import permission_denied

            raise permission_denied(path) from None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: unreadable ({e})") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); the job may have "
                            "died while writing it") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a JSON object")
        try:
            return cls.from_json(data)
        except TypeError as e:
            raise UserError(f"{path}: {e}") from None

    def write(self, run_dir: str | Path) -> Path:
        """This attempt's whole record as results-attempt-N.json, and results.json: the same,
        with a summary of every attempt of the job (a requeued job keeps its run directory)."""
        run = RunDir(run_dir)
        write_json_atomic(run.attempt_results(self.attempt),
                          {**self.to_json(), "attempts": [], "history": {}})
        every = attempt_results(run_dir, strict=False)
        self.attempts = [summary(number, r) for number, r in every]
        self.history = history([r for _, r in every if isinstance(r, Results)])
        path = run.results
        write_json_atomic(path, self.to_json())
        return path

    @property
    def last_eval(self) -> dict | None:
        return self.eval[-1] if self.eval else None

    def whole(self) -> dict:
        """:attr:`history`, or this attempt's own series where the file has none (an older
        hpcsuite wrote it)."""
        return self.history if self.history.get("steps") else history([self])


def energy_record(per_rank: list, samples: int) -> dict:
    """results.json's energy fields from each rank's joules (None where its GPU did not say):
    the sum over the ranks that said, and samples per joule only when every rank said (a
    partial sum would flatter the ratio); {} when none did."""
    said = [j for j in per_rank if isinstance(j, (int, float))]
    if not said:
        return {}
    total = float(sum(said))
    return {"energy_j_per_rank": list(per_rank), "energy_j": total,
            "samples_per_joule": samples / total if len(said) == len(per_rank) and total > 0
            else None}


SUMMARY_KEYS = ("attempt", "job_id", "status", "world_size", "start_step", "final_step", "steps",
                "samples", "elapsed_s", "samples_per_s", "samples_per_s_steady",
                "checkpoint_time_s", "stop")


def attempt_results(run_dir: str | Path, strict: bool = True) -> list[tuple[int, "Results | str"]]:
    """Each attempt's results-attempt-N.json in ``run_dir``, by attempt: its Results, or (not
    ``strict``) the one-line problem of a damaged one (``strict``: a UserError naming it)."""
    from ..errors import UserError

    out: list[tuple[int, Results | str]] = []
    for number, path in RunDir(run_dir).attempt_results_files().items():
        try:
            out.append((number, Results.load(path)))
        except UserError as e:
            if strict:
                raise
            out.append((number, str(e)))
    return out


def summary(number: int, r: "Results | str") -> dict:
    """One attempt in results.json's ``attempts``: SUMMARY_KEYS, the first step it trained
    and its first and last loss (a damaged file: what is wrong with it)."""
    if not isinstance(r, Results):
        return {"attempt": number, "status": "damaged", "problem": r}
    data = r.to_json()
    return {**{k: data.get(k) for k in SUMMARY_KEYS}, "first_step": r.start_step + 1,
            "loss_first": r.loss[0] if r.loss else None, "loss_last": r.loss[-1] if r.loss else None}


def attempt_summaries(run_dir: str | Path, strict: bool = True) -> list[dict]:
    """The summary of each attempt's results-attempt-N.json in ``run_dir``, by attempt."""
    return [summary(number, r) for number, r in attempt_results(run_dir, strict)]


def history(attempts: list["Results"]) -> dict:
    """The attempts of one job (oldest first) as one run: loss and throughput per step from
    the first step any of them trained, and where each began. A step two attempts trained
    (the later one resumed from a checkpoint before it) is the later attempt's."""
    by_step: dict[int, tuple] = {}
    starts = []
    for r in attempts:
        first = r.start_step + 1
        batch = r.batch_size_per_rank * r.grad_accumulation * r.world_size
        for i in range(max(len(r.loss), len(r.step_times_s))):
            t = r.step_times_s[i] if i < len(r.step_times_s) else 0.0
            by_step[first + i] = (r.loss[i] if i < len(r.loss) else None,
                                  batch / t if t > 0 and batch else None)
        starts.append({"attempt": r.attempt, "step": first, "final_step": r.final_step,
                       "status": r.status, "world_size": r.world_size,
                       "samples_per_s": r.samples_per_s,
                       "samples_per_s_steady": r.samples_per_s_steady})
    steps = sorted(by_step)
    return {"steps": steps, "loss": [by_step[k][0] for k in steps],
            "samples_per_s": [by_step[k][1] for k in steps], "attempt_starts": starts}


def step_stats(times: list[float]) -> dict:
    import statistics

    if not times:
        return {"count": 0, "mean": 0.0, "median": 0.0, "p90": 0.0, "min": 0.0, "max": 0.0}
    ordered = sorted(times)
    return {"count": len(times), "mean": statistics.fmean(times), "median": statistics.median(times),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "min": ordered[0], "max": ordered[-1]}


def describe_eval(ev: dict[str, Any]) -> str:
    acc = f", accuracy {100 * ev['accuracy']:.2f}%" if ev.get("accuracy") is not None else ""
    return (f"validation loss {ev['loss']:.4f}{acc} ({ev['samples']} held-out samples, "
            f"epoch {ev['epoch']}, step {ev['step']})")


def _metrics_line(metrics: dict) -> str:
    """A script's own numbers: scalars as they are, series by their last value (the loss has
    its own line)."""
    parts = []
    for key, value in sorted(metrics.items()):
        if key == "loss":
            continue
        if isinstance(value, list) and value and isinstance(value[-1], (int, float)):
            parts.append(f"{key} {value[-1]:.4g} (last of {len(value)})")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{key} {value:.4g}")
    return ", ".join(parts) or "none"


def summarize(run_dir: str | Path) -> str:
    from .comm_bound import line as comm_line
    from .world_change import in_words as world_change_in_words

    run_dir = Path(run_dir)
    r = Results.load(RunDir(run_dir).results)
    sums = r.param_checksums
    # One rank has nobody to agree with: no parameters line then.
    same = None if r.world_size == 1 else "identical on all ranks" \
        if sums and len(set(sums)) == 1 else ("DIFFER across ranks" if sums else "not recorded")
    resumed = f", resumed at step {r.start_step}" if r.resumed_from else ""
    median = r.step_time_s.get("median", 0.0) * 1e3
    lines = [
        f"job {r.job_id} ({r.job}): {r.status} at step {r.final_step}{resumed}; {count(r.world_size, 'rank')} "
        f"on {', '.join(r.hosts) or '?'}, backend {r.backend}" + (", script mode" if r.mode == "script" else ""),
        f"  samples/s {r.samples_per_s:.1f} overall, {r.samples_per_s_steady:.1f} after warm-up; "
        f"step time median {median:.2f} ms",
        f"  {describe_loss(r)}",
        *([f"  {describe_eval(r.last_eval)}"] if r.last_eval else []),
        *([f"  script metrics: {_metrics_line(r.metrics)}"] if set(r.metrics) - {"loss"} else []),
        *([f"  {world_change_in_words(r.world_change)}"] if r.world_change else []),
        *([f"  parameters: {same}"] if same else []),
        *([f"  checkpoints: {len(r.checkpoints)} saved, last {r.checkpoints[-1]['path']}"]
          if r.checkpoints else []),
        *([f"  stopped: {describe_stop(r)}"] if r.stop else []),
        *([f"  attempts: {describe_attempts(r.attempts)}"] if len(r.attempts) > 1 else []),
        *([f"  {bound}"] if (bound := comm_line(r, run_dir)) else []),
        f"  outputs: {run_dir}",
    ]
    return "\n".join(lines)


def describe_stop(r: "Results") -> str:
    s = r.stop
    if s.get("reason") == "time_limit":
        why = f"{s.get('seconds_left', 0):.0f} s before the time limit"
    else:
        why = f"on signal {s.get('signal')}"
    how = ""
    if s.get("seconds_after_signal") is not None:
        how = f", {s['seconds_after_signal']:.2f} s after the signal"
    if s.get("steps_after_notice") is not None:
        how += f", {s['steps_after_notice']} step(s) after the ranks were told"
    return f"{why} at step {r.final_step}, {_saved_words(r)}{how}"


def _saved_words(r: "Results") -> str:
    """Whether the stop left a checkpoint: said only of one that was committed."""
    s = r.stop
    saved = s["saved"] if "saved" in s else \
        any(c.get("step") == r.final_step for c in r.checkpoints)
    if saved:
        return "checkpoint saved"
    if s.get("checkpoint_step") is not None:
        return (f"no checkpoint saved at the stop (the work since the checkpoint at step "
                f"{s['checkpoint_step']} is lost)")
    return "no checkpoint saved (none exists: the training is lost)"


def describe_attempts(attempts: list[dict]) -> str:
    """Each attempt in one line: how it ended, the steps it trained, its ranks and throughput."""
    parts = []
    for a in attempts:
        if a.get("status") == "damaged":
            parts.append(f"{a.get('attempt')}: damaged ({a.get('problem')})")
            continue
        first = a.get("first_step", (a.get("start_step") or 0) + 1)
        rate = a.get("samples_per_s")
        parts.append(f"{a.get('attempt')}: {a.get('status')} at step {a.get('final_step')} "
                     f"(steps {first}-{a.get('final_step')}, {count(a.get('world_size'), 'rank')}"
                     + (f", {rate:.1f} samples/s" if isinstance(rate, (int, float)) else "") + ")")
    return "; ".join(parts)


def describe_loss(r: "Results") -> str:
    """The loss from the first step the job trained to its last, over every attempt, and
    where each later attempt began (its first step)."""
    h = r.whole()
    points = [(s, v) for s, v in zip(h.get("steps", []), h.get("loss", [])) if v is not None]
    if not points:
        return "no loss recorded"
    (s0, first), (s1, last) = points[0], points[-1]
    starts = h.get("attempt_starts", [])
    if len(starts) <= 1 and s0 == r.start_step + 1:
        return f"loss {first:.4f} -> {last:.4f}"
    began = ", ".join(f"attempt {a['attempt']} at step {a['step']}" for a in starts[1:])
    return (f"loss {first:.4f} at step {s0} -> {last:.4f} at step {s1}, over "
            f"{len(starts)} attempt{'s' if len(starts) != 1 else ''}"
            + (f" (began: {began})" if began else ""))


def describe_run(r: "Results") -> str:
    """The whole job in one line (``status``): its loss over every attempt and each
    attempt's throughput."""
    rates = ", ".join(f"{a['attempt']}: {a['samples_per_s']:.1f}"
                      for a in r.whole().get("attempt_starts", [])
                      if isinstance(a.get("samples_per_s"), (int, float)))
    return f"{describe_loss(r)}; samples/s by attempt {rates or 'not recorded'}"
