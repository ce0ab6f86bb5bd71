"""What `study predict` reads and writes: a workload from a measured study, the fabric from the
options or the site profile, and the table, CSV, JSON and PNG of a prediction."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from .predict import DEFAULT_COMPUTE_CV, HELPS, Workload, pooled_cv


def workload_from_study(target: str, backward_fraction: float | None,
                        batch: int | None = None) -> Workload:
    """The workload a study measured: gradient bytes and tensors from a training point's
    results, the step time from the smallest configuration's no-communication limit (or a
    1-rank training point), per micro-batch: the median over those points' jobs at one
    per-rank batch, ``batch`` or else the smallest measured (a study that sweeps the batch
    measured one workload per batch, not one to average). ``backward_fraction`` None: as the
    study report's step model reads the study's jobs (none with one core per rank:
    :func:`~hpcsuite.study.predicted.backward_fraction`)."""
    return study_workload(target, backward_fraction, batch)[0]


def study_workload(target: str, backward_fraction: float | None,
                   batch: int | None = None) -> tuple[Workload, list[str]]:
    """:func:`workload_from_study`, and the configurations whose points it read."""
    from .points import open_study
    from .predicted import backward_fraction as overlap_of
    from .report import _job, _results, throughput

    sd = open_study(target)
    study, state = sd.study(), sd.state()
    candidates = sorted((p for p in sd.points() if p.kind == "limit"
                         or (p.kind == "train" and p.ranks == 1)),
                        key=lambda p: (p.ranks, p.kind != "limit"))
    seen = set()
    for ranks in sorted({p.ranks for p in candidates}):
        found: dict[int, list[tuple[float, dict, dict | None, str]]] = {}
        for point in (p for p in candidates if p.ranks == ranks):
            entry = state.get(point.id, {})
            results = _results(sd, point, entry)
            measured = results and throughput(results, study.warmup_steps, study.steps)
            if measured and results.get("gradient_bytes"):
                step = measured[1] / (results.get("grad_accumulation") or 1)
                size = int(results.get("batch_size_per_rank") or 1)
                found.setdefault(size, []).append((step, results, _job(sd, point, entry),
                                                   point.config))
        seen |= set(found)
        chosen = batch if batch is not None else min(found, default=None)
        if chosen in found:
            steps = [step for step, *_ in found[chosen]]
            last, job = found[chosen][-1][1:3]
            if backward_fraction is None:
                cpus = ((job or {}).get("resources") or {}).get("cpus_per_task") or 1
                backward_fraction = overlap_of(int(cpus))
            return Workload(float(last["gradient_bytes"]), statistics.median(steps), chosen,
                            backward_fraction, int(last.get("gradient_tensors") or 0) or None), \
                sorted({config for *_, config in found[chosen]})
    if batch is not None and seen:
        raise UserError(f"--batch: {target} measured no point at {batch} samples per rank; "
                        f"it measured {', '.join(str(b) for b in sorted(seen))}")
    raise UserError(f"{target}: no finished 1-rank or no-communication point records a step "
                    "time and gradient bytes; run the study first, or give --params/--step-ms")


def parse_cv(text: str | None) -> float | None:
    """``--compute-cv 0.02``: a number at least 0 and under 1, or None when not given."""
    if text is None:
        return None
    try:
        cv = float(text)
    except ValueError:
        cv = float("nan")
    if not 0 <= cv < 1:                                  # NaN fails too
        raise UserError(f"--compute-cv: {text[:40]!r} is not a number at least 0 and under 1 (the "
                        "coefficient of variation of one rank's compute per step, e.g. 0.02)")
    return cv


def spread_for(target: str | None, workload: Workload,
               given: float | None) -> tuple[Workload, str]:
    """The workload with its per-rank compute spread, and where the spread came from: the
    given ``--compute-cv``; else the study's measured points (:func:`study_spread`); else
    :data:`~hpcsuite.study.predict.DEFAULT_COMPUTE_CV`."""
    if given is not None:
        return replace(workload, compute_cv=given), "given (--compute-cv)"
    if target:
        measured = study_spread(target, workload.batch)
        if measured is not None:
            cv, steps, ranks, points = measured
            if cv >= 1:
                raise UserError(f"{target}: its ranks' compute varies by cv {cv:.2f} per step "
                                "(1 or more): give the spread to assume with --compute-cv")
            return replace(workload, compute_cv=cv), (
                f"measured: {steps} steps of {ranks} rank(s) in {points} point(s) of the "
                "study, each rank around its own median")
    return replace(workload, compute_cv=DEFAULT_COMPUTE_CV), (
        "default: 8 % variation among GPUs of one SKU (Sinha et al., arXiv:2208.11035v3) "
        "read as a normal's whisker range")


def study_spread(target: str, batch: int) -> tuple[float, int, int, int] | None:
    """(cv, steps, ranks, points) of the study's no-communication limits and 1-rank training
    points at ``batch`` samples per rank (the points its workload comes from): every rank's
    measured steps (its rank record; rank 0's results where the records are missing), pooled
    by :func:`~hpcsuite.study.predict.pooled_cv`; None when they hold no spread."""
    from ..runs.rundir import RunDir
    from .points import open_study
    from .report import _results, measured_steps

    sd = open_study(target)
    study, state = sd.study(), sd.state()
    per_rank, points = [], 0
    for point in sd.points():
        if not (point.kind == "limit" or (point.kind == "train" and point.ranks == 1)):
            continue
        results = _results(sd, point, state.get(point.id, {}))
        if not results or int(results.get("batch_size_per_rank") or 1) != batch:
            continue
        run, ranks = RunDir(sd.run_dir(point, state[point.id]["job_id"])), []
        for rank in range(int(results.get("world_size") or 1)):
            try:
                times = json.loads(run.rank_record(rank).read_text()).get("step_time_s")
            except (OSError, ValueError, AttributeError):
                times = results.get("step_times_s") if rank == 0 else None
            if isinstance(times, list):
                ranks.append([t for t in measured_steps(times, study.warmup_steps, study.steps)
                              if isinstance(t, (int, float))])
        per_rank += ranks
        points += bool(ranks)
    pooled = pooled_cv(per_rank)
    if pooled is None:
        return None
    return pooled[0], pooled[1], sum(1 for r in per_rank if len(r) >= 2), points


COLUMNS = ["setting", "nodes", "gpus", "step_ms", "throughput", "efficiency",
           "slowest_compute_ms"]


def rows(result: dict) -> list[dict]:
    return [{"setting": name, **row} for name, series in result["series"].items()
            for row in series]


def table(result: dict) -> str:
    w, current = result["workload"], result["series"]["current"]
    own = w.get("compute_ms_at_nodes") or {}
    lines = [*result.get("warnings", []),
             f"fabric: {result['fabric']}, {result['gpus_per_node']} GPU(s) per node",
             f"workload: {w['gradient_bytes'] / 1e6:.1f} MB of float32 gradients, "
             f"{w['step_ms']:.1f} ms per micro-batch of {w['batch']} on one GPU",
             *([f"compute per micro-batch as the study's no-communication limit measured it "
                f"there: " + ", ".join(f"{ms:.1f} ms on {n} node(s)" for n, ms in own.items())
                + ("; elsewhere the one-GPU step" if len(own) < len(current) else "")]
               if own else []),
             f"current: {result['knobs']['current']}",
             f"per-rank compute spread: cv {w['compute_cv']:.4f} per step, "
             f"{w['compute_cv_source'] or 'as given'}",
             f"a step waits for the slowest GPU's compute: "
             f"{current[-1]['slowest_compute_ms']:.1f} ms at {current[-1]['gpus']} GPUs", "",
             f"{'nodes':>6} {'GPUs':>6} {'step ms':>9} {'samples/s':>11} {'eff':>6}   "
             + "  ".join(f"{n[:18]:>18}" for n in result["series"] if n != "current")]
    for i, row in enumerate(current):
        others = "  ".join(f"{s[i]['efficiency']:>18.3f}" for n, s in result["series"].items()
                           if n != "current")
        lines.append(f"{row['nodes']:>6} {row['gpus']:>6} {row['step_ms']:>9.1f} "
                     f"{row['throughput']:>11.1f} {row['efficiency']:>6.3f}   {others}")
    best, below = result["best_knob"], result["below_threshold_at_nodes"]
    lines.append("")
    lines.append(f"helps most at {current[-1]['nodes']} nodes: {best['knob']} "
                 f"({best['efficiency']:.3f}, +{best['gain']:.3f})" if best else
                 f"no knob tried gains {HELPS} or more efficiency at {current[-1]['nodes']} "
                 "nodes")
    lines.append(f"efficiency first falls under {result['threshold']:g} at {below} nodes"
                 if below else f"efficiency stays at or above {result['threshold']:g} up to "
                 f"{current[-1]['nodes']} nodes")
    return "\n".join(lines)


def write(result: dict, csv_path: str | None, json_path: str | None,
          png_path: str | None) -> list[Path]:
    written = []
    if csv_path:
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows(result))
        Path(csv_path).write_text(out.getvalue())
        written.append(Path(csv_path))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        written.append(Path(json_path))
    if png_path:
        plot(result, Path(png_path))
        written.append(Path(png_path))
    return written


def plot(result: dict, path: Path) -> None:
    """Efficiency against nodes, one line per knob setting (matplotlib, imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, series in result["series"].items():
        ax.plot([r["nodes"] for r in series], [r["efficiency"] for r in series], marker="o",
                linewidth=2.5 if name == "current" else 1.2, label=name)
    nodes = [r["nodes"] for r in result["series"]["current"]]
    ax.axhline(result["threshold"], color="grey", linestyle=":", label="threshold")
    if len(nodes) > 1 and nodes[-1] / max(nodes[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(nodes)
    ax.set_xticklabels([str(n) for n in nodes])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel(f"nodes ({result['gpus_per_node']} GPU(s) each)")
    ax.set_ylabel("predicted scaling efficiency")
    ax.set_title(result["fabric"][:80], fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_nodes(text: str) -> list[int]:
    """``--nodes 1,2,4,8``: distinct positive integers, in increasing order."""
    try:
        nodes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"--nodes: {text!r} is not a comma-separated list of node counts, "
                        "e.g. 1,2,4,8") from None
    if not nodes or min(nodes) < 1 or max(nodes) > 1_000_000:
        raise UserError(f"--nodes: {text!r}: each node count must be between 1 and 1000000")
    return sorted(set(nodes))


def measured_fabric(target: str | None):
    """``--fabric measured``: the link the study's own allreduce benchmark measured, on its
    allocation with the most nodes: MPI's bus bandwidth of large allreduces (the median over
    its sizes from 1 MiB up) and the per-step latency MPI's α-β fit gives. Not the fit's B: on
    the local cluster's 1 Gbit/s link the many small sizes set it 8 % above what the large
    ones carried (docs/BENCHMARKS.md, "Studies, predict and the knobs on the shaped link")."""
    from ..alphabeta import FitError, large_busbw
    from ..fabrics import Fabric, Link
    from .points import open_study
    from .report import _results, fit_measurements

    if not target:
        raise UserError("--fabric: measured reads a study's allreduce benchmark; give the study")
    sd = open_study(target)
    state = sd.state()
    benches = sorted((p for p in sd.points() if p.kind == "allreduce"
                      and int(p.axes["nodes"]) > 1), key=lambda p: -int(p.axes["nodes"]))
    for point in benches:
        data = _results(sd, point, state.get(point.id, {}))
        if not data:
            continue
        try:
            alpha = fit_measurements(data, "mpi").alpha_s
            rows = [r for r in data.get("points", []) if r.get("mpi_s")]
            large = large_busbw([r["bytes"] for r in rows], [r["mpi_s"] for r in rows],
                                int(data["world_size"]))
        except (FitError, KeyError, TypeError, ValueError):
            continue
        if large:
            return Fabric(f"measured by {target} on {point.axes['nodes']} nodes",
                          Link(large["median_Bps"] / 1e9, alpha * 1e6), base_latency_us=0.0)
    raise UserError(f"--fabric: {target} has no finished allreduce benchmark across nodes "
                    "with MPI's times of 1 MiB or more (a study of one node measures no link)")


def fabric_for(name, bandwidth, latency, intra, hierarchical, profile_fabric, target=None):
    """The fabric from --fabric NAME (``measured``: the study's own benchmark),
    --bandwidth/--latency, or else the site profile's."""
    from ..fabrics import Fabric, Link, intra_preset, preset, unknown_preset, INTRA_PRESETS

    if name and (bandwidth is not None or latency is not None):
        raise UserError("--fabric: give a preset or --bandwidth/--latency, not both")
    if (bandwidth is None) != (latency is None):
        raise UserError("--bandwidth: give both --bandwidth (GB/s) and --latency (us)")
    if intra and unknown_preset(intra, INTRA_PRESETS):
        raise UserError(f"--intra-node: {unknown_preset(intra, INTRA_PRESETS)}")
    if name == "measured":
        fabric = measured_fabric(target)
    elif name:
        if unknown_preset(name):
            raise UserError(f"--fabric: {unknown_preset(name)}")
        fabric = Fabric(name, preset(name))
    elif bandwidth is not None:
        fabric = Fabric(f"{bandwidth:g} GB/s, {latency:g} us", Link(bandwidth, latency))
    elif profile_fabric is not None:
        fabric = profile_fabric
    else:
        raise UserError("--fabric: no fabric: name a preset (--fabric), give --bandwidth and "
                        "--latency, or set `fabric:` in the site profile")
    if intra:
        fabric = Fabric(f"{fabric.name} + {intra}", fabric.inter, intra_preset(intra),
                        fabric.two_level)
    return fabric


def workload_for(target, params, model_bytes, step_ms, throughput, batch,
                 backward_fraction, tensors) -> Workload:
    """The workload from a study, or from --params/--model-bytes and --step-ms or
    --throughput with --batch."""
    given = [o for o, v in (("--params", params), ("--model-bytes", model_bytes)) if v is not None]
    if target:
        if given or step_ms is not None or throughput is not None:
            raise UserError(f"{given[0] if given else '--step-ms'}: a study gives the model and "
                            "the step time; leave the option out or leave the study out")
        return workload_from_study(target, backward_fraction, batch)
    if len(given) != 1:
        raise UserError("--params: without a study give the model as --params N or "
                        "--model-bytes B (one of them)")
    if (step_ms is None) == (throughput is None):
        raise UserError("--step-ms: without a study give --step-ms T or --throughput S "
                        "(samples/s of one GPU), one of them")
    batch = batch or 1
    step_s = step_ms / 1000 if step_ms is not None else batch / throughput
    nbytes = model_bytes if model_bytes is not None else params * 4
    return Workload(float(nbytes), step_s, batch,
                    2 / 3 if backward_fraction is None else backward_fraction, tensors)


def profile_fabric(profile_path: str | None):
    """The fabric the site profile layers name (``fabric:``), or None."""
    from ..fabrics import from_profile
    from ..submit.config import discover, merge
    from ..submit.schema import build
    from ..submit.site_profile import SiteProfile

    layers = discover(None, profile_path)
    _, profile, _ = merge(layers)
    source = next((layer.source for layer in layers if layer.name == "site"), "site profile")
    return from_profile(build(SiteProfile, profile, source).fabric)
