"""`hpcsuite report RUN`: PNG plots of one run from its results.json (matplotlib, headless).

loss.png        the global loss per optimizer step (and validation loss, when there was one)
throughput.png  samples/s of every step (all ranks), with a rolling median
utilisation.png with train.monitor: each rank's CPU (or GPU) use and memory over time

and, for each Horovod timeline window the run recorded (``train.monitor.timeline_steps``), the
time per step its activities took (waiting for the other ranks in NEGOTIATE_*, the allreduce
itself and what it is made of), summed over the tensors.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UserError
from .results import RESULTS, Results


def load(run_dir: Path) -> Results:
    path = run_dir / RESULTS
    if not path.is_file():
        raise UserError(f"{path}: no results yet (the job has not finished, or it failed: "
                        "`hpcsuite status` and `hpcsuite logs` tell)")
    return Results.load(path)


_WINDOW = re.compile(r"horovod-timeline-steps-(\d+)-(\d+)\.json$")


def timeline_windows(run_dir: Path) -> list[Path]:
    return sorted((p for p in run_dir.glob("horovod-timeline-steps-*.json")
                   if _WINDOW.search(p.name)), key=lambda p: int(_WINDOW.search(p.name).group(1)))


def timeline_summary(path: Path) -> dict:
    """{"first", "last", "steps", "per_step_ms": {activity: ms per step}} of one window file
    (Chrome trace events: B/E pairs per tensor; a file cut short lacks its closing bracket)."""
    import json

    m = _WINDOW.search(path.name)
    first, last = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    text = path.read_text(errors="replace").strip().rstrip(",")
    try:
        events = json.loads(text if text.endswith("]") else text + "]")
    except ValueError as e:
        raise UserError(f"{path}: not a Horovod timeline ({e})") from None
    stacks: dict = {}
    totals: dict[str, float] = {}
    for ev in events if isinstance(events, list) else []:
        if not isinstance(ev, dict) or ev.get("ph") not in ("B", "E"):
            continue
        stack = stacks.setdefault(ev.get("pid"), [])
        if ev["ph"] == "B":
            stack.append((str(ev.get("name")), float(ev.get("ts", 0))))
        elif stack:
            name, ts = stack.pop()
            totals[name] = totals.get(name, 0.0) + float(ev.get("ts", 0)) - ts
    steps = max(1, last - first)
    return {"file": str(path), "first": first, "last": last, "steps": steps,
            "per_step_ms": {k: v / 1000.0 / steps for k, v in
                            sorted(totals.items(), key=lambda kv: -kv[1])}}


def timeline_line(summary: dict) -> str:
    parts = ", ".join(f"{k} {v:.3g} ms" for k, v in summary["per_step_ms"].items())
    return (f"Horovod timeline, steps {summary['first']}-{summary['last']}, per step (summed "
            f"over tensors): {parts or 'no activity recorded'}")


def _rolling_median(values: list[float], width: int) -> list[float]:
    import numpy as np

    if len(values) < width:
        return list(values)
    v = np.asarray(values, dtype=float)
    windows = np.lib.stride_tricks.sliding_window_view(v, width)
    med = np.median(windows, axis=1)
    return [float(x) for x in np.concatenate([np.full(width - 1, np.nan), med])]


def plot(run_dir: Path, out: Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = load(run_dir)
    out = out or run_dir
    out.mkdir(parents=True, exist_ok=True)
    written = []
    steps = list(range(r.start_step + 1, r.start_step + 1 + len(r.loss)))

    fig, ax = plt.subplots(figsize=(7, 4))
    if r.loss:
        ax.plot(steps, r.loss, lw=1, label="training loss (all ranks)")
    for ev in [e for e in r.eval if e.get("loss") is not None][:200]:
        ax.plot([ev["step"]], [ev["loss"]], "o", color="C3")
    if r.eval:
        ax.plot([], [], "o", color="C3", label="validation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(f"{r.job} (job {r.job_id}): loss")
    if r.loss and min(r.loss) > 0:
        ax.set_yscale("log")
    ax.legend()
    written.append(_save(fig, out / "loss.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    per_rank = r.batch_size_per_rank * r.grad_accumulation * r.world_size
    rates = [per_rank / t for t in r.step_times_s if t > 0]
    if rates:
        ax.plot(steps[:len(rates)], rates, lw=0.5, alpha=0.5, label="per step")
        ax.plot(steps[:len(rates)], _rolling_median(rates, min(25, len(rates))), lw=1.5,
                label="rolling median (25 steps)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title(f"{r.job}: throughput, {r.world_size} ranks")
    ax.legend()
    written.append(_save(fig, out / "throughput.png"))

    if r.utilisation and any(r.utilisation):
        gpu = any("gpu_percent" in s for series in r.utilisation for s in series)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for rank, series in enumerate(r.utilisation):
            t = [s["t"] for s in series]
            top.plot(t, [s.get("gpu_percent" if gpu else "cpu_percent", 0.0) for s in series],
                     lw=1, label=f"rank {rank}")
            bottom.plot(t, [s.get("gpu_memory_bytes" if gpu else "rss_bytes", 0) / 2**20
                            for s in series], lw=1, label=f"rank {rank}")
        top.set_ylabel("GPU utilisation %" if gpu else "CPU % of one core")
        bottom.set_ylabel("GPU memory MiB" if gpu else "resident memory MiB")
        bottom.set_xlabel("seconds since training began")
        top.set_title(f"{r.job}: utilisation")
        top.legend()
        written.append(_save(fig, out / "utilisation.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
