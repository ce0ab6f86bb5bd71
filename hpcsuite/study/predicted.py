"""Each configuration's step time as the step model predicts it, beside the measured one.

The model is `study predict`'s (:func:`hpcsuite.study.predict.steady_step_s`), fed with what
the study itself measured and nothing tuned per point:

* **compute**: the median step of the series' 1-rank point (the same axes but for nodes and
  tasks per node), per micro-batch, scaled by the per-rank batch (the same batch in weak
  scaling; in strong scaling the batch, and so the computation, shrinks with the ranks);
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

from ..fabrics import Fabric, Link
from .advice import horovod_knobs
from .predict import Knobs, Workload, steady_step_s

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


def predict_row(row: dict, base: dict | None, fits: tuple | None) -> dict:
    """The prediction of one configuration: ``base`` is its series' 1-rank row, ``fits`` the
    (Horovod, MPI) fits of its allocation. Returns {"step_s": None, "why": ...} when the study
    lacks an input."""
    results, measured = row.get("results"), row["step_s"]["median"]
    if results is None or not measured:
        return {"step_s": None, "why": "no finished run"}
    if base is None or not base["step_s"]["median"] or base.get("results") is None:
        return {"step_s": None, "why": "the series has no finished 1-rank point to take the "
                                       "computation from"}
    job = row.get("job") or {}
    horovod = job.get("train", {}).get("horovod") or horovod_knobs(row["axes"])
    cpus = int(job.get("resources", {}).get("cpus_per_task") or 1)
    knobs = Knobs(cycle_ms=float(horovod.get("cycle_time_ms", 1.0)),
                  fusion_mb=float(horovod.get("fusion_threshold_mb", 64)),
                  fp16=horovod.get("compression") == "fp16",
                  accumulation=int(results.get("grad_accumulation") or 1))
    base_results = base["results"]
    per_batch = (results.get("batch_size_per_rank") or 1) / \
        (base_results.get("batch_size_per_rank") or 1)
    compute = base["step_s"]["median"] / (base_results.get("grad_accumulation") or 1) * per_batch
    workload = Workload(float(results.get("gradient_bytes") or 0), compute,
                        int(results.get("batch_size_per_rank") or 1), backward_fraction(cpus),
                        int(results.get("gradient_tensors") or 0) or None)
    nodes, tasks = int(row["axes"]["nodes"]), int(row["axes"]["tasks_per_node"])
    fabric = fabric_of(*fits) if fits else None
    if nodes * tasks > 1 and fabric is None:
        return {"step_s": None, "why": "no allreduce benchmark on this allocation"}
    fab = fabric[0] if fabric else Fabric("none (one rank)", Link(1.0, 0.0), base_latency_us=0)
    step = steady_step_s(workload, nodes, tasks, fab, knobs)
    return {"step_s": step, "error": (step - measured) / measured,
            "compute_s": compute * knobs.accumulation, "fabric": fabric[1] if fabric else None,
            "bandwidth_Bps": fab.inter.bandwidth_Bps if fabric else None,
            "alpha_s": fab.inter.latency_s if fabric else None,
            "backward_fraction": workload.backward_fraction, "knobs": knobs.label(),
            "from_1_rank": base is row}


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
            + (f"; {own} of them the 1-rank points the computation is taken from" if own else ""))
        for r in done:
            if abs(r["predicted_error"]) > TOLERANCE:
                lines.append(f"  outside ±{TOLERANCE:.0%}: {_name(r)}: predicted "
                             f"{r['predicted_step_s'] * 1000:.3f} ms, measured "
                             f"{r['step_s']['median'] * 1000:.3f} ms "
                             f"({_pct(r['predicted_error'])})")
    used = {(r["ranks"], p["fabric"], p["alpha_s"], p["bandwidth_Bps"], p["backward_fraction"])
            for r in done for p in [r["prediction"]] if p.get("fabric")}
    for ranks, fabric, alpha, bandwidth, overlap in sorted(used):
        lines.append(f"  step model on {ranks} ranks: {fabric}, alpha {alpha * 1e6:.1f} us per "
                     f"ring step, B {bandwidth / 1e9:.2f} GB/s, "
                     + ("no overlap (one core per rank)" if overlap == 0 else
                        f"allreduces overlap the backward pass (the last {overlap:.2f} of a "
                        "step)"))
    for r in rows:
        if r.get("predicted_error") is None and r["step_s"]["median"]:
            lines.append(f"  no prediction for {_name(r)}: {r['prediction']['why']}")
    return lines


def _name(row: dict) -> str:
    return f"{row['config']} ({row['series']}, {row['ranks']} rank(s))"


def _pct(error: float) -> str:
    return f"{error * 100:+.1f}%" if math.isfinite(error) else str(error)
