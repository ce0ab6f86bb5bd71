"""What a study measured, and why: the table, the communication model's reading, the files.

Each training point's throughput is its global batch over the median of its measured step
times (the warm-up steps left out), one number per repeat; a configuration shows the median,
min and max of its repeats. Speedup and efficiency are read against the smallest point of the
same series (the same axes but for nodes and tasks per node), each swept Horovod knob at its
axis's first value (:func:`baseline_axes`); "of limit" against the same
configuration trained without the gradient allreduce, the most this hardware could do (one
function, :func:`hpcsuite.study.advice.of_limit`, for the table and the advice alike).

A configuration whose measurements cannot carry a diagnosis is flagged instead of read as
communication overhead (:func:`flags`): repeats that disagree, or a no-communication limit
that does not grow with the ranks (they competed for the CPU).

Each other configuration gets the ring-allreduce model's reading, fitted here to the study's
allreduce benchmarks (:func:`fits`) and read by :func:`hpcsuite.study.advice.explain`: the
predicted communication beside the measured overhead, where communication starts to dominate
and which knob would help most; :func:`table` and :func:`advice` put it in words.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from ..errors import UserError
from ..runs.rundir import RunDir
from .advice import explain, of_limit
from .points import Point, StudyDir
from .bundle import ENVIRONMENT
from .predicted import gbps, predict_rows, summary
from .run import point_done, point_result

REPORT_DIR = "report"


# ---------------------------------------------------------------------- reading results

def _results(sd: StudyDir, point: Point, entry: dict) -> dict | None:
    if not point_done(sd, point, entry):
        return None
    return json.loads(point_result(sd, point, entry["job_id"]).read_text())


def _job(sd: StudyDir, point: Point, entry: dict) -> dict | None:
    """The job spec a point's run ran with (its run directory's job.json), or None."""
    try:
        job = json.loads(RunDir(sd.run_dir(point, entry["job_id"])).job.read_text())
    except (OSError, ValueError, KeyError):
        return None
    return job if isinstance(job, dict) else None


def measured_steps(times: list, warmup: int, steps: int) -> list:
    """The measured window of one job's step times: the warm-up steps left out."""
    return times[warmup:warmup + steps] if len(times) > warmup + 2 else times[1:]


def rank_step_times(sd: StudyDir, point: Point, entry: dict, results: dict, warmup: int,
                    steps: int) -> list[float]:
    """Every rank's measured step times of one job, one list (each rank's record; rank 0's
    results where the records are missing): what the step model draws each rank's
    computation from."""
    def window(times) -> list[float]:
        if not isinstance(times, list):
            return []
        return [t for t in measured_steps(times, warmup, steps)
                if isinstance(t, (int, float)) and t > 0]

    run, out = RunDir(sd.run_dir(point, entry["job_id"])), []
    for rank in range(int(results.get("world_size") or 1)):
        try:
            out += window(json.loads(run.rank_record(rank).read_text()).get("step_time_s"))
        except (OSError, ValueError, AttributeError):
            pass
    return out or window(results.get("step_times_s"))


def throughput(results: dict, warmup: int, steps: int) -> tuple[float, float] | None:
    """(samples/s, median step seconds) over the measured steps of one job."""
    measured = measured_steps(results.get("step_times_s") or [], warmup, steps)
    if not measured:
        return None
    step = statistics.median(measured)
    batch = (results.get("batch_size_per_rank", 0) * results.get("world_size", 1)
             * results.get("grad_accumulation", 1))
    return (batch / step if step > 0 else 0.0), step


def spread(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def axes_label(axes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes.items())


def fits(sd: StudyDir, points: list[Point], state: dict) -> dict[tuple[int, int], tuple]:
    """The ring-allreduce fits of each allocation's benchmark: (Horovod's, MPI's or None)."""
    from ..alphabeta import FitError

    out = {}
    for point in points:
        if point.kind != "allreduce":
            continue
        data = _results(sd, point, state.get(point.id, {}))
        if data:
            try:
                mpi = fit_measurements(data, "mpi")
            except (FitError, KeyError, TypeError, ValueError):
                mpi = None               # an older benchmark without MPI's side
            out[(int(point.axes["nodes"]), int(point.axes["tasks_per_node"]))] = \
                (fit_measurements(data, "horovod"), mpi)
    return out


def fit_measurements(data: dict, which: str):
    """The α-β fit of one side ("horovod" or "mpi") of an allreduce benchmark's results:
    fitted here to its measured points, so that a report reads every benchmark with today's
    fit; the fit the benchmark recorded where it kept no points."""
    from ..alphabeta import AlphaBeta, fit

    rows = [r for r in data.get("points", []) if isinstance(r, dict) and r.get(f"{which}_s")]
    if len({r.get("bytes") for r in rows}) < 2 and \
            isinstance(data.get("fit", {}).get(which), dict) and "alpha_s" in data["fit"][which]:
        return AlphaBeta.from_json(data["fit"][which])
    return fit([r["bytes"] for r in rows], [r[f"{which}_s"] for r in rows], int(data["world_size"]))


def measure(sd: StudyDir) -> list[dict]:
    """One row per configuration: what its jobs measured (the spreads of its repeats), its
    speed-up and efficiency against its baseline (:func:`baseline_axes`) and its flags; the
    jobs' results, spec and step times are still in it (``results``, ``job``, ``step_times``,
    ``limit_step_times``) for the model to read. No model here: `study predict` reads the
    flags through it, and imports nothing heavy."""
    study, state = sd.study(), sd.state()
    configs: dict[str, dict] = {}
    for point in sd.points():
        if point.kind == "allreduce":
            continue
        row = configs.setdefault(point.config, {
            "config": point.config, "axes": point.axes, "ranks": point.ranks,
            "series": series_of(point.axes),
            "throughput": [], "step_s": [], "limit_throughput": [], "limit_step_s": [],
            "jobs": [], "results": None, "job": None, "step_times": [], "limit_step_times": [],
            "energy_j": [], "samples_per_joule": []})
        results = _results(sd, point, state.get(point.id, {}))
        if results is None:
            continue
        measured = throughput(results, study.warmup_steps, study.steps)
        if measured is None:
            continue
        prefix = "limit_" if point.kind == "limit" else ""
        row[f"{prefix}throughput"].append(measured[0])
        row[f"{prefix}step_s"].append(measured[1])
        row[f"{prefix}step_times"] += rank_step_times(sd, point, state[point.id], results,
                                                      study.warmup_steps, study.steps)
        if point.kind == "train":
            _add_train(row, results, sd, point, state[point.id])
    rows = sorted(configs.values(), key=lambda r: (r["series"], r["ranks"], r["config"]))
    for row in rows:
        for key in ("throughput", "limit_throughput", "step_s", "limit_step_s", "energy_j",
                    "samples_per_joule"):
            row[key] = spread(row[key])
    for row in rows:
        own = _smallest(rows, row["series"])
        base = _smallest(rows, series_of(baseline_axes(row["axes"], study.axes)))
        thr = row["throughput"]
        row["speedup"] = row["efficiency"] = row["speedup_against"] = None
        if base and thr["median"] and base["throughput"]["median"]:
            row["speedup"] = thr["median"] / base["throughput"]["median"]
            row["efficiency"] = row["speedup"] / (row["ranks"] / base["ranks"])
            row["speedup_against"] = base["config"]
        row["of_limit"] = of_limit(row)
        row["flags"] = flags(row, own, study.mode)
    return rows


def series_of(axes: dict) -> str:
    """A configuration's series: its axes but for nodes and tasks per node."""
    return axes_label({k: v for k, v in axes.items()
                       if k not in ("nodes", "tasks_per_node")}) or "all"


def baseline_axes(axes: dict, study_axes: dict) -> dict:
    """The configuration a row's speed-up and efficiency are read against (at its series'
    fewest ranks): the same axes, each Horovod knob (``horovod.*``) at its axis's first value.
    A knob setting is its own series, and against itself every setting is 1.00; against the
    baseline setting it is what the knob bought."""
    return {k: (study_axes[k][0] if k.startswith("horovod.") and study_axes.get(k) else v)
            for k, v in axes.items()}


def _smallest(rows: list[dict], series: str) -> dict | None:
    """The series' row of fewest ranks that has a measured throughput."""
    return min((r for r in rows if r["series"] == series and r["throughput"]["n"]),
               key=lambda r: r["ranks"], default=None)


def analyse(sd: StudyDir) -> dict:
    """The study's numbers: one row per configuration (:func:`measure`), with the model's
    reading."""
    study = sd.study()
    models = fits(sd, sd.points(), sd.state())
    rows = measure(sd)
    for row in rows:
        row["model"] = explain(row, *models.get((int(row["axes"]["nodes"]),
                                                 int(row["axes"]["tasks_per_node"])), (None, None)))
    predict_rows(rows, models)
    for row in rows:
        for key in ("results", "job", "step_times", "limit_step_times"):
            row.pop(key)
    return {"study": study.name, "mode": study.mode, "warmup_steps": study.warmup_steps,
            "steps": study.steps, "repeats": study.repeats, "rows": rows,
            "baseline": {k: v[0] for k, v in study.axes.items()
                         if k.startswith("horovod.") and v},
            "warnings": environment_warnings(sd),
            "allreduce": {f"{n}x{t}": m.to_json() for (n, t), (m, _) in models.items()}}


def environment_warnings(sd: StudyDir) -> list[str]:
    from .env import warnings

    path = sd.path / ENVIRONMENT
    try:
        env = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"warning: {path}: missing or unreadable; the versions are not recorded"]
    return warnings(env if isinstance(env, dict) else {})


# Repeats of one configuration whose throughput spreads more than this (max/min) did not
# measure one thing (another job on the nodes, a throttled core): the local cluster's repeats
# agree within ~5%, so 25% is far past noise, and a median of such repeats explains nothing.
SPREAD_FLAG = 1.25
# Under weak scaling every rank does the same work, so the no-communication limit's throughput
# grows as the ranks do (N/N0 times the series' smallest point) when each rank has its own
# cores. Below this fraction of that growth the ranks competed for the CPU (more ranks than
# cores, or threads oversubscribed), and the step time they lost is not communication.
LIMIT_GROWTH_FLAG = 0.75


def _add_train(row: dict, results: dict, sd: StudyDir, point: Point, entry: dict) -> None:
    """A training point's job, energy, results and any slow rank named, into its row."""
    row["jobs"].append(entry["job_id"])
    for key in ("energy_j", "samples_per_joule"):    # GPUs with train.monitor
        if isinstance(results.get(key), (int, float)):
            row[key].append(results[key])
    row["results"] = row["results"] or results
    row["job"] = row["job"] or _job(sd, point, entry)
    slow = (results.get("rank_balance") or {}).get("slow_rank")
    if isinstance(slow, dict) and slow.get("rank") is not None:
        row.setdefault("slow_ranks", []).append(slow)


def flags(row: dict, base: dict | None, mode: str) -> list[str]:
    """Why a configuration's overhead cannot be read as communication; [] when it can."""
    out = []
    for key, what in (("throughput", "repeats"), ("limit_throughput", "the limit's repeats")):
        t = row[key]
        if t["n"] >= 2 and t["min"] and t["max"] / t["min"] > SPREAD_FLAG:
            out.append(f"{what} spread {t['max'] / t['min']:.2f}x (more than {SPREAD_FLAG}x): "
                       "they did not measure one thing")
    for slow in row.get("slow_ranks", []):      # runs/stragglers.py named one in a repeat
        from ..runs.stragglers import line

        out.append(f"slow rank in a repeat: {line(slow)}")
    lim = row["limit_throughput"]["median"]
    base_lim = base and base["limit_throughput"]["median"]
    # Strong scaling shrinks each rank's batch, which alone slows the limit's growth.
    if mode == "weak" and base and lim and base_lim and row["ranks"] > base["ranks"]:
        expected = row["ranks"] / base["ranks"]
        grew = lim / base_lim
        if grew < LIMIT_GROWTH_FLAG * expected:
            out.append(f"the no-communication limit grew {grew:.2f}x from {base['ranks']} to "
                       f"{row['ranks']} ranks, not ~{expected:g}x: the ranks competed for the "
                       "CPU")
    return out


# ---------------------------------------------------------------------- output

# measured_*: read from the jobs' step times; predicted_*: the ring-allreduce model's, fitted
# to the allreduce benchmarks (predicted_step_s: the step model's whole step, predicted_error:
# its (predicted - measured) / measured); best_knob_*: the model's prediction for the best knob.
COLUMNS = ["series", "config", "ranks", "measured_throughput_median", "measured_throughput_min",
           "measured_throughput_max", "repeats", "measured_speedup", "measured_efficiency",
           "measured_limit_throughput_median", "measured_of_limit", "measured_step_ms",
           "predicted_step_s", "predicted_error", "measured_limit_step_ms", "measured_overhead_ms",
           "predicted_comm_ms", "flags", "best_knob", "predicted_best_knob_of_limit",
           "measured_energy_j", "measured_samples_per_joule"]


def flat(row: dict) -> dict:
    m = row.get("model") or {}
    best = (m.get("knobs") or [{}])[0]

    def ms(v):
        return None if v is None else v * 1000

    return {"series": row["series"], "config": row["config"], "ranks": row["ranks"],
            "measured_throughput_median": row["throughput"]["median"],
            "measured_throughput_min": row["throughput"]["min"],
            "measured_throughput_max": row["throughput"]["max"],
            "repeats": row["throughput"]["n"], "measured_speedup": row["speedup"],
            "measured_efficiency": row["efficiency"],
            "measured_limit_throughput_median": row["limit_throughput"]["median"],
            "measured_of_limit": row["of_limit"], "measured_step_ms": ms(row["step_s"]["median"]),
            "predicted_step_s": row.get("predicted_step_s"),
            "predicted_error": row.get("predicted_error"),
            "measured_limit_step_ms": ms(row["limit_step_s"]["median"]),
            "measured_overhead_ms": ms(m.get("measured_overhead_s")),
            "predicted_comm_ms": ms(m.get("predicted_comm_s")),
            "flags": "; ".join(row.get("flags") or []),
            "best_knob": best.get("knob"), "predicted_best_knob_of_limit": best.get("of_limit"),
            "measured_energy_j": _energy(row, "energy_j"),
            "measured_samples_per_joule": _energy(row, "samples_per_joule")}


def _energy(row: dict, key: str):
    """The median over a configuration's repeats of a GPU energy figure (None: not measured;
    a report.json written before energy was recorded has no such key)."""
    return (row.get(key) or {}).get("median")


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pct(error) -> str:
    return "-" if error is None else f"{error * 100:+.1f}%"


def _ms(seconds, fmt: str) -> str:
    return _num(None if seconds is None else seconds * 1000, fmt)


def header(width: int = 24, energy: bool = False) -> str:
    """The table's column names; the series column is ``width`` wide (the longest series, at
    least 24), so two series that differ only at the end of their names stay apart; with
    ``energy`` (a point measured its GPUs' energy) the joules and samples per joule."""
    return (f"{'series':<{width}} {'ranks':>5} {'measured samples/s med [min-max]':>32} "
            f"{'speedup':>7} {'effic.':>6} {'limit/s':>9} {'of limit':>8} {'step ms':>8} "
            f"{'step ms':>9} {'error':>7} {'comm ms':>9}"
            + (f" {'GPU J':>9} {'samples/J':>9}" if energy else "") + "  flag")


def table(report: dict) -> str:
    w = max([24, *(len(r["series"]) for r in report["rows"])])
    energy = any(_energy(r, "energy_j") is not None for r in report["rows"])
    lines = [f"study {report['study']} ({report['mode']} scaling; {report['repeats']} repeats, "
             f"{report['steps']} measured steps after {report['warmup_steps']} warm-up)",
             *report.get("warnings", []),
             "measured: from the jobs' step times (limit/s, of limit: the same configuration "
             "without the allreduce); predicted: the step model (each rank's computation from "
             "the limit on the same ranks, else the series' 1-rank point; the fitted "
             "allreduce, Horovod's cycle, fusion), error against the measured step; comm ms: "
             "predicted by the allreduce model",
             *(["speedup, effic.: against " + axes_label(report["baseline"]) + " (each Horovod "
                "knob axis's first value) at the fewest ranks"] if report.get("baseline") else []),
             header(w, energy),
             f"{'':<{w}} {'':>5} {'measured':>32} {'measured':>7} {'meas.':>6} {'measured':>9} "
             f"{'measured':>8} {'measured':>8} {'predicted':>9} {'':>7} {'predicted':>9}"
             + (f" {'measured':>9} {'measured':>9}" if energy else "")]
    for row in report["rows"]:
        t, m = row["throughput"], row.get("model") or {}
        rng = (f"{_num(t['median'], '.1f')} [{_num(t['min'], '.1f')}-{_num(t['max'], '.1f')}]"
               if t["n"] else "(no results yet)")
        lines.append(
            f"{row['series']:<{w}} {row['ranks']:>5} {rng:>32} {_num(row['speedup'], '.2f'):>7} "
            f"{_num(row['efficiency'], '.2f'):>6} {_num(row['limit_throughput']['median'], '.1f'):>9} "
            f"{_num(row['of_limit'], '.2f'):>8} {_ms(row['step_s']['median'], '.2f'):>8} "
            f"{_ms(row.get('predicted_step_s'), '.2f'):>9} {_pct(row.get('predicted_error')):>7} "
            f"{_ms(m.get('predicted_comm_s'), '.3f'):>9}"
            + (f" {_num(_energy(row, 'energy_j'), '.1f'):>9} "
               f"{_num(_energy(row, 'samples_per_joule'), '.2f'):>9}" if energy else "")
            + f"  {'FLAGGED' if row.get('flags') else ''}".rstrip())
    lines += summary(report["rows"])
    for key, fit in report["allreduce"].items():
        lines.append(f"allreduce model on {key} (nodes x tasks): alpha {fit['alpha_s'] * 1e6:.1f} us, "
                     f"bandwidth {gbps(fit['bandwidth_Bps'])}")
    for row in report["rows"]:
        lines += advice(row)
    return "\n".join(lines)


def advice(row: dict) -> list[str]:
    """The reading of one configuration: its flags, or its overhead and the knobs."""
    m = row.get("model")
    head = f"{row['config']} ({axes_label(row['axes'])})"
    if row.get("flags"):
        return [f"{head}: FLAGGED, not diagnosed: " + "; ".join(row["flags"]) +
                "; run it again with the nodes to itself (max_in_flight: 1, one rank per core)"]
    if not m or m.get("measured_overhead_s") is None:
        return []
    lines = [f"{head}: measured step {m['step_s'] * 1000:.2f} ms = compute "
             f"{m['compute_s'] * 1000:.2f} ms (the limit) + overhead "
             f"{m['measured_overhead_s'] * 1000:.2f} ms ({row['of_limit']:.2f} of limit); the "
             f"model predicts {m['predicted_comm_s'] * 1000:.3f} ms of allreduce "
             f"({m['allreduce_ops']} op(s), {m['gradient_bytes'] / 2**20:.2f} MiB)"]
    where = m.get("dominates_at_ranks")
    lines.append("  communication would pass computation at " +
                 (f"~{where} ranks (model, same per-rank work)" if where else
                  "no rank count below 100,000 (model)"))
    for k in m["knobs"][:3]:
        lines.append(f"  {k['knob']}: {k['how']} -> predicted {k['of_limit']:.2f} of limit "
                     f"(measured now {m['now_of_limit']:.2f}, {k['gain']:+.2f})")
    return lines


def write(sd: StudyDir) -> tuple[dict, list[Path]]:
    """Analyse the study and write report.json, report.csv, report.txt and the plots."""
    from ..runs.results import write_json_atomic

    report = analyse(sd)
    if not any(r["throughput"]["n"] for r in report["rows"]):
        raise UserError(f"{sd.path}: no point has finished yet; `hpcsuite study status` shows "
                        "where they are")
    folder = sd.path / REPORT_DIR
    folder.mkdir(exist_ok=True)
    write_json_atomic(folder / "report.json", report)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for row in report["rows"]:
        writer.writerow(flat(row))
    (folder / "report.csv").write_text(buf.getvalue())
    text = table(report)
    (folder / "report.txt").write_text(text + "\n")
    paths = [folder / "report.json", folder / "report.csv", folder / "report.txt"]
    from .plots import plots

    return report, paths + plots(report, folder)
