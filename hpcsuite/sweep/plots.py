"""A sweep's plot: the metric against the first numeric axis (one line per combination of the
other axes), or one bar per element when no axis is numeric; the best element is starred
(matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def plot(data: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [r for r in data["rows"] if r["metric"] is not None]
    name = data["metric"]["name"]
    numeric = [a for a in data["axes"]
               if all(_is_number(r["values"].get(a)) for r in rows)
               and len({r["values"].get(a) for r in rows}) > 1]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    best = next((r for r in rows if r["best"]), None)
    if numeric:
        x_axis = numeric[0]
        others = [a for a in data["axes"] if a != x_axis]
        series: dict[str, list] = {}
        for r in rows:
            label = ", ".join(f"{a}={r['values'].get(a)}" for a in others) or name
            series.setdefault(label, []).append(r)
        for label, members in series.items():
            members.sort(key=lambda r: r["values"][x_axis])
            ax.plot([r["values"][x_axis] for r in members], [r["metric"] for r in members],
                    marker="o", label=label)
        xs = [r["values"][x_axis] for r in rows]
        if min(xs) > 0 and max(xs) / min(xs) >= 100:
            ax.set_xscale("log")
        ax.set_xlabel(x_axis)
        if best is not None:
            ax.plot([best["values"][x_axis]], [best["metric"]], marker="*", markersize=18,
                    color="gold", markeredgecolor="black", linestyle="none",
                    label=f"best: element {best['index']}")
        ax.legend(fontsize="small")
    else:
        labels = [str(r["index"]) for r in rows]
        bars = ax.bar(labels, [r["metric"] for r in rows], color="tab:blue")
        for bar, r in zip(bars, rows):
            if r["best"]:
                bar.set_color("gold")
                bar.set_edgecolor("black")
        ax.set_xlabel("element (gold: best)")
    ax.set_ylabel(f"{name} ({data['metric']['goal']} is best)")
    ax.set_title(f"sweep {data['sweep']}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
