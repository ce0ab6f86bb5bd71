"""Each configuration's step time as the step model predicts it, beside the measured one.

The model is `study predict`'s (:mod:`hpcsuite.study.predict`: Horovod's cycle, fusion, the
ring allreduce, steps back to back), fed with what the study itself measured and nothing tuned
per point:

* **compute** (:func:`computation`): each rank's step times in the no-communication limit on
  the point's own ranks, where the study measured it; else the series' 1-rank point's, scaled
  by the per-rank batch. Each simulated step draws one per rank and waits for the slowest
  (:func:`hpcsuite.study.predict.sampled_step_s`); the predicted step is their mean. The
  series' 1-rank point is its own computation;
* **gradients**: the bytes and tensors the point's results record;
* **fabric**: the allocation's allreduce benchmark as one flat ring with no base latency
  (:func:`fabric_of`);
* **knobs**: the cycle time, fusion threshold and compression the point's job ran with, its
  gradient accumulation;
* **overlap**: none when each rank has one core (:func:`backward_fraction`).

A point's error is (predicted - measured) / measured; :func:`summary` counts the points within
:data:`TOLERANCE` and names the worst.
"""

from __future__ import annotations

import math
import statistics

from ..fabrics import Fabric, Link
from .advice import horovod_knobs
from .predict import Knobs, Workload, sampled_step_s

# The bar of the issue: the model explains a point when it is within ±15 % of its median step.
TOLERANCE = 0.15


def fabric_of(horovod, mpi) -> tuple[Fabric, str] | None:
    """The allocation's measured allreduce as a flat fabric (bandwidth B, latency α per ring
    step, nothing more per allreduce), and which fit it is.

    MPI's fit when the benchmark has one: it is the transfer Horovod makes underneath, without
    Horovod's cycle. Horovod's own fit has that cycle in it (its α is half a cycle on 2 ranks:
    506 µs at a 1 ms cycle, docs/BENCHMARKS.md "Allreduce: Horovod vs MPI"), and the step model
    counts the cycle itself, so Horovod's α would count it twice. An older benchmark without
    MPI's side gives Horovod's bandwidth, its α left out for that reason."""
    if mpi is not None:
        fit, which, alpha = mpi, "MPI's allreduce", mpi.alpha_s
    elif horovod is not None:
        fit, which, alpha = horovod, "Horovod's allreduce (its alpha, the cycle, left out)", 0.0
    else:
        return None
    link = Link(fit.bandwidth_Bps / 1e9, alpha * 1e6)
    return Fabric(f"fitted: {which}", link, base_latency_us=0.0), which


def backward_fraction(cpus_per_task: int) -> float:
    """How much of a step the allreduce can hide under: the backward pass (2/3 of a step, the
    step model's default) when a rank has cores to spare, nothing when it has one.

    With one core a rank's training thread, Horovod's background thread and OpenMPI's TCP
    progress take turns on it: nothing of the allreduce overlaps the computation (measured on
    the local cluster with its nodes pinned to one core each, docs/BENCHMARKS.md "Fourth run":
    at batch 512 the 2-node step is 3.14 ms against 2.51 ms with no allreduce, the whole
    allreduce and cycle wait added on the core that computes)."""
    return 0.0 if cpus_per_task <= 1 else 2 / 3


def computation(row: dict, base: dict | None) -> tuple[list[float], str] | None:
    """What each rank computes per micro-batch, as measured step times to draw from, and where
    they come from; None when the study has neither.

    The no-communication limit on the point's own ranks when the study measured it: the same
    job without the allreduce, so each rank's steps are its computation on this allocation,
    beside the other ranks, with its spread. Otherwise the series' 1-rank point (its steps,
    scaled by the per-rank batch: the same batch in weak scaling; in strong scaling the
    batch, and so the computation, shrinks with the ranks). On the local cluster the two
    differ: two ranks on the VM's two cores compute more slowly and more variably than one
    rank alone (docs/BENCHMARKS.md, "The step model against each measured point")."""
    results = row["results"]
    if row.get("limit_step_times"):
        k = results.get("grad_accumulation") or 1
        return [t / k for t in row["limit_step_times"]], f"the limit on {row['ranks']} ranks"
    if base is None or not base.get("step_times") or base.get("results") is None:
        return None
    return _from_1_rank(row, base), "the 1-rank point"


def _from_1_rank(row: dict, base: dict) -> list[float]:
    results, base_results = row["results"], base["results"]
    per_batch = (results.get("batch_size_per_rank") or 1) / \
        (base_results.get("batch_size_per_rank") or 1)
    k = base_results.get("grad_accumulation") or 1
    return [t / k * per_batch for t in base["step_times"]]


def predict_row(row: dict, base: dict | None, fits: tuple | None) -> dict:
    """The prediction of one configuration: ``base`` is its series' 1-rank row, ``fits`` the
    (Horovod, MPI) fits of its allocation. Returns {"step_s": None, "why": ...} when the study
    lacks an input. The series' 1-rank point is its own computation (its step is the measured
    one); every other point's step is :func:`~hpcsuite.study.predict.sampled_step_s` over
    :func:`computation`, and, where that came from the limit, ``via_1_rank`` gives the same
    model fed with the 1-rank point instead."""
    results, measured = row.get("results"), row["step_s"]["median"]
    if results is None or not measured:
        return {"step_s": None, "why": "no finished run"}
    nodes, tasks = int(row["axes"]["nodes"]), int(row["axes"]["tasks_per_node"])
    own = base is row and nodes * tasks == 1
    source = ([measured / (results.get("grad_accumulation") or 1)], "its own steps") if own \
        else computation(row, base)
    if source is None:
        return {"step_s": None, "why": "the series has no finished 1-rank point to take the "
                                       "computation from"}
    job = row.get("job") or {}
    horovod = job.get("train", {}).get("horovod") or horovod_knobs(row["axes"])
    cpus = int(job.get("resources", {}).get("cpus_per_task") or 1)
    knobs = Knobs(cycle_ms=float(horovod.get("cycle_time_ms", 1.0)),
                  fusion_mb=float(horovod.get("fusion_threshold_mb", 64)),
                  fp16=horovod.get("compression") == "fp16",
                  accumulation=int(results.get("grad_accumulation") or 1))
    fabric = fabric_of(*fits) if fits else None
    if nodes * tasks > 1 and fabric is None:
        return {"step_s": None, "why": "no allreduce benchmark on this allocation"}
    fab = fabric[0] if fabric else Fabric("none (one rank)", Link(1.0, 0.0), base_latency_us=0)
    computes, where = source
    workload = Workload(float(results.get("gradient_bytes") or 0), computes[0],
                        int(results.get("batch_size_per_rank") or 1), backward_fraction(cpus),
                        int(results.get("gradient_tensors") or 0) or None)

    def step_of(samples: list[float]) -> float:
        if own:
            return samples[0] * knobs.accumulation
        return sampled_step_s(workload, samples, nodes, tasks, fab, knobs)

    step = step_of(computes)
    out = {"step_s": step, "error": (step - measured) / measured,
           "compute_s": statistics.median(computes) * knobs.accumulation,
           "computation": where, "fabric": fabric[1] if fabric else None,
           "bandwidth_Bps": fab.inter.bandwidth_Bps if fabric else None,
           "alpha_s": fab.inter.latency_s if fabric else None,
           "backward_fraction": workload.backward_fraction, "knobs": knobs.label(),
           "from_1_rank": own}
    if not own and where.startswith("the limit") and base is not None and \
            base.get("step_times") and base.get("results") is not None:
        other = step_of(_from_1_rank(row, base))
        out["via_1_rank"] = {"step_s": other, "error": (other - measured) / measured}
    return out


def predict_rows(rows: list[dict], fits: dict) -> None:
    """Set each row's ``prediction``, ``predicted_step_s`` and ``predicted_error``; ``fits``
    maps (nodes, tasks per node) to the allocation's (Horovod, MPI) fits."""
    for row in rows:
        base = next((r for r in rows if r["series"] == row["series"] and r["ranks"] == 1),
                    None)
        key = (int(row["axes"]["nodes"]), int(row["axes"]["tasks_per_node"]))
        p = predict_row(row, base, fits.get(key))
        row["prediction"] = p
        row["predicted_step_s"] = p["step_s"]
        row["predicted_error"] = p.get("error")


def summary(rows: list[dict]) -> list[str]:
    """"prediction within ±15 % for K of M points (worst: ...)", then every point outside it
    and every point without a prediction, by name."""
    done = [r for r in rows if r.get("predicted_error") is not None]
    lines = []
    if done:
        inside = [r for r in done if abs(r["predicted_error"]) <= TOLERANCE]
        worst = max(done, key=lambda r: abs(r["predicted_error"]))
        own = sum(1 for r in done if r["prediction"].get("from_1_rank"))
        lines.append(
            f"prediction within ±{TOLERANCE:.0%} for {len(inside)} of {len(done)} points "
            f"(worst: {_name(worst)}, {_pct(worst['predicted_error'])})"
            + (f"; {own} of them 1-rank points, their own computation" if own else ""))
        sound = [r for r in done if not r.get("flags")]
        if len(sound) < len(done):
            lines.append(f"  of the {len(sound)} points the report does not flag: "
                         f"{sum(1 for r in sound if abs(r['predicted_error']) <= TOLERANCE)} "
                         f"within (a flagged point's repeats or limit disagree: its measurement, "
                         f"not the model, is in question)")
        for r in done:
            if abs(r["predicted_error"]) > TOLERANCE:
                lines.append(f"  outside ±{TOLERANCE:.0%}: {_name(r)}: predicted "
                             f"{r['predicted_step_s'] * 1000:.3f} ms, measured "
                             f"{r['step_s']['median'] * 1000:.3f} ms "
                             f"({_pct(r['predicted_error'])})")
    lines += _sources(done)
    used = {(r["ranks"], p["fabric"], p["alpha_s"], p["bandwidth_Bps"], p["backward_fraction"])
            for r in done for p in [r["prediction"]] if p.get("fabric")}
    for ranks, fabric, alpha, bandwidth, overlap in sorted(used):
        lines.append(f"  step model on {ranks} ranks: {fabric}, alpha {alpha * 1e6:.1f} us per "
                     f"ring step, B {gbps(bandwidth)}, "
                     + ("no overlap (one core per rank)" if overlap == 0 else
                        f"allreduces overlap the backward pass (the last {overlap:.2f} of a "
                        "step)"))
    for r in rows:
        if r.get("predicted_error") is None and r["step_s"]["median"]:
            lines.append(f"  no prediction for {_name(r)}: {r['prediction']['why']}")
    return lines


def _sources(done: list[dict]) -> list[str]:
    """Where the computation of the multi-rank points came from, and how the same model does
    fed with the 1-rank point instead where it came from the limit."""
    counts: dict[str, int] = {}
    for r in done:
        where = r["prediction"].get("computation")
        if where and not r["prediction"].get("from_1_rank"):
            key = "the limit on the point's own ranks" if where.startswith("the limit") else where
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return []
    lines = ["  computation: " + "; ".join(f"{where} for {n} point(s)"
                                          for where, n in counts.items())
             + " (each rank's step times; a step waits for the slowest rank)"]
    other = [r for r in done if r["prediction"].get("via_1_rank")]
    if other:
        errors = [r["prediction"]["via_1_rank"]["error"] for r in other]
        worst = max(zip(errors, other), key=lambda e: abs(e[0]))
        inside = sum(1 for e in errors if abs(e) <= TOLERANCE)
        lines.append(f"  fed the series' 1-rank point instead: within ±{TOLERANCE:.0%} for "
                     f"{inside} of {len(other)} (worst: {_name(worst[1])}, {_pct(worst[0])})")
    return lines


def gbps(bytes_per_s: float) -> str:
    """A bandwidth in GB/s to three significant figures, without an exponent: 0.0295 GB/s
    (two decimals said 0.03 of a 29.5 MB/s link), 1.37 GB/s, 1230 GB/s."""
    x = float(f"{bytes_per_s / 1e9:.3g}")
    return f"{x:.3g} GB/s" if abs(x) < 1000 else f"{x:.0f} GB/s"


def _name(row: dict) -> str:
    return f"{row['config']} ({row['series']}, {row['ranks']} rank(s))"


def _pct(error: float) -> str:
    return f"{error * 100:+.1f}%" if math.isfinite(error) else str(error)
