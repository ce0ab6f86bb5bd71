"""A study's plots: throughput and efficiency against ranks, each series with its ideal and
its no-communication limit (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def plots(report: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    series = sorted({r["series"] for r in report["rows"]})
    fig_t, ax_t = plt.subplots(figsize=(7, 4.5))
    fig_e, ax_e = plt.subplots(figsize=(7, 4.5))
    for name in series:
        rows = [r for r in report["rows"] if r["series"] == name and r["throughput"]["n"]]
        if not rows:
            continue
        ranks = [r["ranks"] for r in rows]
        med = [r["throughput"]["median"] for r in rows]
        err = [[m - r["throughput"]["min"] for m, r in zip(med, rows)],
               [r["throughput"]["max"] - m for m, r in zip(med, rows)]]
        line = ax_t.errorbar(ranks, med, yerr=err, marker="o", capsize=4, label=f"{name}")
        color = line[0].get_color()
        ideal = [med[0] * k / ranks[0] for k in ranks]
        ax_t.plot(ranks, ideal, linestyle=":", color=color, label=f"{name}: ideal")
        lim = [(k, r["limit_throughput"]["median"]) for k, r in zip(ranks, rows)
               if r["limit_throughput"]["median"]]
        if lim:
            ax_t.plot(*zip(*lim), linestyle="--", marker="x", color=color,
                      label=f"{name}: no-communication limit")
        eff = [(k, r["efficiency"]) for k, r in zip(ranks, rows) if r["efficiency"] is not None]
        if eff:
            lo = [(r["throughput"]["min"] / r["throughput"]["median"]) * r["efficiency"] for r in rows
                  if r["efficiency"] is not None]
            hi = [(r["throughput"]["max"] / r["throughput"]["median"]) * r["efficiency"] for r in rows
                  if r["efficiency"] is not None]
            ks, es = zip(*eff)
            ax_e.errorbar(ks, es, yerr=[[e - l for e, l in zip(es, lo)], [h - e for e, h in zip(es, hi)]],
                          marker="o", capsize=4, color=color, label=f"{name}: efficiency")
        ofl = [(k, r["of_limit"]) for k, r in zip(ranks, rows) if r["of_limit"] is not None]
        if ofl:
            ax_e.plot(*zip(*ofl), linestyle="--", marker="x", color=color,
                      label=f"{name}: of no-communication limit")
    all_ranks = sorted({r["ranks"] for r in report["rows"]})
    if all_ranks:
        ax_e.plot([all_ranks[0], all_ranks[-1]], [1, 1], color="grey", linestyle=":", label="ideal")
    for ax, ylabel in ((ax_t, "samples/s (median, min-max of repeats)"), (ax_e, "efficiency")):
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.set_xticks(all_ranks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_e.set_ylim(bottom=0)
    ax_t.set_title(f"{report['study']}: throughput ({report['mode']} scaling)")
    ax_e.set_title(f"{report['study']}: efficiency")
    for fig, name in ((fig_t, "throughput.png"), (fig_e, "efficiency.png")):
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written.append(folder / name)
    return written

