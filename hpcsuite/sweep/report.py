"""A sweep's report: one row per element with its final and best numbers, the best element
by the sweep's metric, written as report/sweep.csv, report/sweep.json and report/sweep.png."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..errors import UserError
from .spec import metric_goal
from .status import element_rows
from .sweepdir import REPORT_CSV, REPORT_JSON, REPORT_PNG, SweepDir

COLUMNS = ("final_loss", "val_accuracy", "val_loss", "samples_per_s")
# The validation columns are each run's best, not its last: said under the table, since the
# highest accuracy and the lowest loss may come from different epochs.
BEST_NOTE = ("best val acc / best val loss: the highest accuracy and the lowest loss over each "
             "run's validations (each at its own epoch); final loss: the last training step's")


def numbers(run_dir: str | None) -> tuple[dict, str | None]:
    """(final training loss, best validation accuracy and loss, samples/s, the script's own
    metrics) of the run in ``run_dir``; a note when its results cannot be read."""
    from ..runs.results import Results
    from ..runs.rundir import RunDir

    empty = {k: None for k in COLUMNS} | {"metrics": {}, "status": None}
    if not run_dir or not RunDir(run_dir).results.is_file():
        return empty, None
    try:
        r = Results.load(RunDir(run_dir).results)
    except UserError as e:
        return empty, str(e)
    accuracies = [e["accuracy"] for e in r.eval if isinstance(e.get("accuracy"), (int, float))]
    losses = [e["loss"] for e in r.eval if isinstance(e.get("loss"), (int, float))]
    loss = (r.whole().get("loss") or r.loss or [None])[-1]
    return {"final_loss": loss, "val_accuracy": max(accuracies, default=None),
            "val_loss": min(losses, default=None), "samples_per_s": r.samples_per_s or None,
            "metrics": r.metrics if isinstance(r.metrics, dict) else {}, "status": r.status}, None


def metric_of(row: dict, name: str):
    if name.startswith("metrics."):
        value = row["metrics"].get(name[len("metrics."):])
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return row.get("final_loss" if name == "loss" else name)


def report(sd: SweepDir, query=None) -> dict:
    """The table (one row per element), the best element, and the notes."""
    d = sd.definition()
    metric = d.get("metric") or {}
    name = metric.get("name") or "val_accuracy"
    goal = metric_goal(name, metric.get("goal"))
    rows_by_index, note = element_rows(sd, query)
    rows, notes = [], [note] if note else []
    for i, status in sorted(rows_by_index.items()):
        found, problem = numbers(status["run_dir"])
        if problem:
            notes.append(f"element {i}: {problem}")
        row = {"index": i, "values": status["values"], "job_id": status["job_id"],
               "state": "COMPLETED" if status["done"] else status["state"], **found}
        row["metric"] = metric_of(row, name) if status["done"] else None
        rows.append(row)
    ranked = [r for r in rows if isinstance(r["metric"], (int, float))]
    best = (max if goal == "max" else min)(ranked, key=lambda r: r["metric"]) if ranked else None
    for r in rows:
        r["best"] = r is best
    missing = [str(r["index"]) for r in rows if r["metric"] is None]
    if missing:
        notes.append(f"no {name} for element(s) {', '.join(missing[:20])}"
                     + (" ..." if len(missing) > 20 else "") + " (not completed, or the run "
                     "did not record it)")
    return {"sweep": d["name"], "metric": {"name": name, "goal": goal},
            "axes": list(d["axes"]), "rows": rows, "best": best["index"] if best else None,
            "notes": notes}


def write(sd: SweepDir, data: dict) -> list[Path]:
    """report/sweep.csv, report/sweep.json and report/sweep.png (when any element has the
    metric)."""
    folder = sd.report_dir
    folder.mkdir(exist_ok=True)
    with open(folder / REPORT_JSON, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    axes = data["axes"]
    with open(folder / REPORT_CSV, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["index", *axes, "job_id", "state", *COLUMNS, data["metric"]["name"], "best"])
        for r in data["rows"]:
            out.writerow([r["index"], *(r["values"].get(a) for a in axes), r["job_id"], r["state"],
                          *(r[c] for c in COLUMNS), r["metric"], "yes" if r["best"] else ""])
    written = [folder / REPORT_CSV, folder / REPORT_JSON]
    if any(r["metric"] is not None for r in data["rows"]):
        from .plots import plot

        written.append(plot(data, folder / REPORT_PNG))
    return written


def table(data: dict) -> list[str]:
    """The report as text: one line per element, the best marked with *."""
    axes = data["axes"]
    widths = [max(len(a), *(len(_cell(r["values"].get(a))) for r in data["rows"])) for a in axes]
    head = ["  #", *(a.rjust(w) for a, w in zip(axes, widths)), "job".rjust(10),
            "state".ljust(10), "final loss", "best val acc", "best val loss", " samples/s"]
    lines = [" ".join(head)]
    for r in data["rows"]:
        cells = [("*" if r["best"] else " ") + f"{r['index']:>2}",
                 *(_cell(r["values"].get(a)).rjust(w) for a, w in zip(axes, widths)),
                 (r["job_id"] or "-").rjust(10), r["state"][:10].ljust(10),
                 _num(r["final_loss"], 10, ".4f"), _num(r["val_accuracy"], 12, ".2%"),
                 _num(r["val_loss"], 13, ".4f"), _num(r["samples_per_s"], 10, ".1f")]
        lines.append(" ".join(cells))
    m = data["metric"]
    if data["best"] is not None:
        best = data["rows"][[r["index"] for r in data["rows"]].index(data["best"])]
        lines.append(f"* best by {m['name']} ({m['goal']}): element {best['index']} "
                     f"({_values(best['values'])}), {m['name']} {best['metric']:.6g}")
    else:
        lines.append(f"no element has {m['name']} yet")
    if any(r["val_accuracy"] is not None or r["val_loss"] is not None for r in data["rows"]):
        lines.append(BEST_NOTE)
    return lines


def _cell(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _num(value, width: int, fmt: str) -> str:
    return (format(value, fmt) if isinstance(value, (int, float)) else "-").rjust(width)


def _values(values: dict) -> str:
    return ", ".join(f"{k}={_cell(v)}" for k, v in values.items())
