"""`hpcsuite report RUN`: PNG plots of one run from its results.json (matplotlib, headless).

loss.png        the loss per optimizer step from the first step the job trained, over every
                attempt of a requeued job (a dashed line where each later attempt began), and
                the validation loss when there was one. The managed loop's loss is the mean
                over all ranks' samples; a script's is what rank 0 gave run.log()
throughput.png  samples/s of every step (global batch / rank 0's step time), with a rolling
                median and each attempt's throughput after warm-up
metrics.png     script mode: each other series the script gave run.log(), as rank 0 logged it
utilisation.png with train.monitor: each rank's CPU (or GPU) use and memory over time

and, for each Horovod timeline window the run recorded (``train.monitor.timeline_steps``), the
time per step its activities took (waiting for the other ranks in NEGOTIATE_*, the allreduce
itself and what it is made of), summed over the tensors; with ``train.monitor.tensorboard``, where
the TensorBoard event files are and how to open them; with train.monitor on GPUs, whether they
were starved or underused, and their energy (:mod:`.gpu_use`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from .results import Results
from .rundir import LOSS_PLOT, METRICS_PLOT, THROUGHPUT_PLOT, UTILISATION_PLOT, RunDir, timeline_window_steps


def load(run_dir: Path) -> Results:
    path = RunDir(run_dir).results
    if not path.is_file():
        raise UserError(f"{path}: no results yet (the job has not finished, or it failed: "
                        "`hpcsuite status` and `hpcsuite logs` tell)")
    return Results.load(path)


def nothing_recorded(run_dir: Path, job_id: str) -> str | None:
    """The line for a run whose script completed without hpcsuite.api (so no results.json will
    come, and there is nothing to plot), else None."""
    from .script_ranks import nothing_recorded_line, read, records_nothing

    rd = RunDir(run_dir)
    if rd.results.is_file() or rd.failed_markers() or not records_nothing(read(run_dir)):
        return None
    return f"job {job_id} {nothing_recorded_line(job_id)}; there is nothing to plot"


def gpu_findings(run_dir: Path) -> list[str]:
    """What the run's GPUs did, in lines: starved or underused, and their energy."""
    from .gpu_use import gpu_lines

    return gpu_lines(load(run_dir))


def slow_rank_findings(run_dir: Path) -> list[str]:
    """The rank the others waited for in the run's last attempt, if one was named
    (:mod:`.stragglers`), then each rank's own time and wait per step; nothing otherwise."""
    from .stragglers import line

    results = load(run_dir)
    balance = results.rank_balance or {}
    slow = balance.get("slow_rank")
    if not isinstance(slow, dict) or slow.get("rank") is None:
        from .comm_bound import line as comm_line

        bound = comm_line(results, run_dir)
        if bound:
            return [bound]
        own = balance.get("own_s") or []
        if results.mode == "script" and len(own) > 1 and all(t is None for t in own):
            return ["slow rank: not watched: the script's allreduce was not timed, and a step "
                    "alone is the same on every rank (run.time_allreduce(optimizer) times it)"]
        return []
    out = [f"slow rank: {line(slow)}"]
    own, wait = balance.get("own_s") or [], balance.get("wait_s") or []
    if own and all(t is not None for t in own):
        out.append("per rank, own work / wait per step: " + ", ".join(
            f"{r}: {1e3 * o:.2f}/{1e3 * w:.2f} ms" if w is not None else f"{r}: {1e3 * o:.2f} ms"
            for r, (o, w) in enumerate(zip(own, wait or [None] * len(own)))))
    return out


def timeline_windows(run_dir: Path) -> list[Path]:
    return RunDir(run_dir).timeline_windows()


def tensorboard_line(run_dir: Path) -> str | None:
    """Where the run's TensorBoard event files are and the command that opens them; None
    when it wrote none."""
    import shlex

    run = RunDir(run_dir)
    files = run.tensorboard_files()
    if not files:
        return None
    attempts = "one attempt" if len(files) == 1 else f"{len(files)} attempts"
    return (f"{run.tensorboard}\n  TensorBoard event files ({attempts}, rank 0's): "
            f"tensorboard --logdir {shlex.quote(str(run.tensorboard.absolute()))}")


def timeline_summary(path: Path) -> dict:
    """{"first", "last", "steps", "per_step_ms": {activity: ms per step}} of one window file
    (Chrome trace events: B/E pairs per tensor; a file cut short lacks its closing bracket)."""
    import json

    first, last = timeline_window_steps(path.name) or (0, 0)
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
    h = r.whole()
    starts = h.get("attempt_starts", [])
    title = f"{r.job} (job {r.job_id})" + (f", {len(starts)} attempts" if len(starts) > 1 else "")
    written = [_loss_plot(plt, r, h, title, out / LOSS_PLOT),
               _throughput_plot(plt, r, h, title, out / THROUGHPUT_PLOT)]
    series = {k: v for k, v in r.metrics.items() if k != "loss" and isinstance(v, list)
              and v and all(isinstance(x, (int, float)) for x in v)}
    if r.mode == "script" and series:
        written.append(_metrics_plot(plt, r, series, title, out / METRICS_PLOT))
    if r.utilisation and any(r.utilisation):
        written.append(_utilisation_plot(plt, r, title, out / UTILISATION_PLOT))
    return written


def _attempt_lines(ax, starts: list[dict]) -> None:
    """A dashed vertical line where each attempt after the first began (its first step)."""
    for k, a in enumerate(starts[1:]):
        ax.axvline(a["step"], color="0.4", ls="--", lw=0.8,
                   label="an attempt began (requeued)" if k == 0 else None)
        ax.annotate(f"attempt {a['attempt']}", (a["step"], 1), xycoords=("data", "axes fraction"),
                    xytext=(2, -10), textcoords="offset points", fontsize=7, color="0.3")


def _loss_plot(plt, r, h: dict, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    points = [(s, v) for s, v in zip(h.get("steps", []), h.get("loss", [])) if v is not None]
    what = "training loss, rank 0's (run.log)" if r.mode == "script" else \
        "training loss, mean over all ranks"
    if points:
        ax.plot([s for s, _ in points], [v for _, v in points], lw=1, label=what)
    for ev in [e for e in r.eval if e.get("loss") is not None][:200]:
        ax.plot([ev["step"]], [ev["loss"]], "o", color="C3")
    if r.eval:
        ax.plot([], [], "o", color="C3", label="validation loss (held-out samples, all ranks)")
    _attempt_lines(ax, h.get("attempt_starts", []))
    ax.set_xlabel("optimizer step (counted from the job's first)")
    ax.set_ylabel("loss (per sample)" + (", log scale" if points and min(v for _, v in points) > 0 else ""))
    ax.set_title(f"{title}: loss per step")
    if points and min(v for _, v in points) > 0:
        ax.set_yscale("log")
    if points or r.eval:
        ax.legend(fontsize=8)
    return _save(fig, path)


def _throughput_plot(plt, r, h: dict, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    points = [(s, v) for s, v in zip(h.get("steps", []), h.get("samples_per_s", [])) if v]
    starts = h.get("attempt_starts", [])
    if points:
        ax.plot([s for s, _ in points], [v for _, v in points], lw=0.5, alpha=0.5, label="per step")
        bounds = [a["step"] for a in starts[1:]]
        for k, lo in enumerate([0, *bounds]):         # a median never mixes two attempts
            hi = bounds[k] if k < len(bounds) else float("inf")
            part = [(s, v) for s, v in points if lo <= s < hi]
            if part:
                rates = [v for _, v in part]
                ax.plot([s for s, _ in part], _rolling_median(rates, min(25, len(rates))), lw=1.5,
                        color="C1", label="rolling median (25 steps)" if k == 0 else None)
    for k, a in enumerate(starts):
        end = starts[k + 1]["step"] - 1 if k + 1 < len(starts) else a.get("final_step", a["step"])
        if a.get("samples_per_s_steady"):
            ax.hlines(a["samples_per_s_steady"], a["step"], max(end, a["step"]), colors="C3", lw=1.5,
                      label="each attempt after warm-up" if k == 0 else None)
    _attempt_lines(ax, starts)
    ranks = sorted({a.get("world_size") for a in starts} - {None}) or [r.world_size]
    ax.set_xlabel("optimizer step (counted from the job's first)")
    ax.set_ylabel("samples/s, all ranks (global batch / step time)")
    ax.set_title(f"{title}: throughput, {'/'.join(map(str, ranks))} ranks")
    if points:
        ax.legend(fontsize=8)
    return _save(fig, path)


def _metrics_plot(plt, r, series: dict, title: str, path: Path) -> Path:
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.2 + 1.6 * len(series)), sharex=True,
                             squeeze=False)
    for ax, (name, values) in zip(axes[:, 0], sorted(series.items())):
        ax.plot(range(r.start_step + 1, r.start_step + 1 + len(values)), values, lw=1)
        ax.set_ylabel(name)
    axes[-1, 0].set_xlabel("optimizer step (this attempt)")
    axes[0, 0].set_title(f"{title}: the script's run.log() values, rank 0's")
    return _save(fig, path)


def _utilisation_plot(plt, r, title: str, path: Path) -> Path:
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
    bottom.set_xlabel("seconds since training began (last attempt)")
    top.set_title(f"{title}: utilisation per rank")
    top.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
