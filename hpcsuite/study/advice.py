"""The communication model's reading of one configuration, and the knob that would help most.

The ring-allreduce model (:mod:`hpcsuite.alphabeta`), fitted to the study's allreduce
benchmarks, predicts a point's communication per step from the gradient bytes its results
record; :func:`explain` sets it beside the measured overhead (step time minus the
no-communication limit's step time), says where communication starts to dominate and predicts
what each Horovod or training knob would gain. :func:`of_limit` is the one measure of a
configuration against its limit, for the report's table and this advice alike.
"""

from __future__ import annotations

import math


def of_limit(row: dict) -> float | None:
    """How close a configuration comes to its no-communication limit: the limit's median step
    time over its own (the same batch per step, so the ratio of the throughputs). The table
    and the advice both show this number."""
    step, limit = row["step_s"]["median"], row["limit_step_s"]["median"]
    return limit / step if step and limit else None


def explain(row: dict, model, mpi=None) -> dict | None:
    """Predicted communication per step, the measured overhead, and the knobs' predicted gains.
    ``model`` is the fit of Horovod's allreduce, ``mpi`` (optional) of MPI's own on the same
    allocation: the bytes' transfer without Horovod's cycle, and the latency every cycle's
    coordination pays."""
    results = row.get("results")
    if model is None or results is None or row["ranks"] < 2 or not row["step_s"]["median"]:
        return None
    knobs = horovod_knobs(row["axes"])
    n = row["ranks"]
    nbytes = results.get("gradient_bytes", 0) * (0.5 if knobs["compression"] == "fp16" else 1)
    fusion = knobs["fusion_threshold_mb"] * 1024 * 1024
    ops = max(1, math.ceil(nbytes / fusion)) if fusion else max(1, results.get("gradient_tensors", 1))
    predicted = model.predict(nbytes, n=n, tensors=ops)
    latency = model.predict(0, n=n, tensors=ops)
    step = row["step_s"]["median"]
    compute = row["limit_step_s"]["median"]
    out = {"gradient_bytes": nbytes, "allreduce_ops": ops, "predicted_comm_s": predicted,
           "predicted_latency_s": latency, "predicted_bandwidth_s": predicted - latency,
           "step_s": step, "compute_s": compute,
           "comm_fraction": predicted / step if step else None}
    if compute is None or row.get("flags"):
        return out                       # a flagged row's overhead is not communication
    overhead = max(step - compute, 0.0)
    out["measured_overhead_s"] = overhead
    out["unexplained_s"] = overhead - predicted
    out["dominates_at_ranks"] = dominates_at(model, nbytes, ops, compute)
    out["now_of_limit"] = of_limit(row)
    out["knobs"] = sorted(_knob_options(out, knobs, results, n, mpi), key=lambda o: -o["gain"])
    return out


def horovod_knobs(axes: dict) -> dict:
    """The Horovod knobs a configuration ran with: the job spec's defaults, then its axes
    (what a study knows of them without the job's own job.json)."""
    from ..submit.spec import HorovodKnobs

    return {**{f: getattr(HorovodKnobs(), f) for f in ("compression", "fusion_threshold_mb",
                                                       "cycle_time_ms")},
            **{k[8:]: v for k, v in axes.items() if k.startswith("horovod.")}}


def _gain(knob: str, new_compute: float, new_overhead: float, how: str, now: float) -> dict:
    """One knob's advice: the fraction of the limit the model predicts with it, against
    ``now``'s."""
    eff = new_compute / (new_compute + max(new_overhead, 0.0))
    return {"knob": knob, "how": how, "of_limit": eff, "gain": eff - now}


def _knob_options(m: dict, knobs: dict, results: dict, n: int, mpi) -> list[dict]:
    """What each knob that applies would gain, read from :func:`explain`'s numbers ``m``."""
    compute, overhead, now = m["compute_s"], m["measured_overhead_s"], m["now_of_limit"]
    nbytes, ops, step = m["gradient_bytes"], m["allreduce_ops"], m["step_s"]
    latency, bandwidth = m["predicted_latency_s"], m["predicted_bandwidth_s"]
    k = scale_to_reach(compute, overhead)
    why = (f"the smallest power of two predicted to reach {TARGET_OF_LIMIT:.2f} of the limit"
           if k < MAX_SCALE or k * compute / (k * compute + overhead) >= TARGET_OF_LIMIT
           else f"the most this advice goes to; {TARGET_OF_LIMIT:.2f} of the limit needs more")
    batch, accumulation = results.get("batch_size_per_rank"), results.get("grad_accumulation") or 1
    options = [
        _gain("train.batch_size", k * compute, overhead,
              f"{k}x the per-rank batch" + (f" ({batch * k})" if batch else "") +
              f": {k}x the computation for the same allreduce, {why}", now),
        _gain("train.grad_accumulation", k * compute, overhead,
              f"accumulate {accumulation * k} micro-batches per allreduce: the same, without "
              "the memory", now),
    ]
    if knobs["compression"] != "fp16":
        options.append(_gain("train.horovod.compression", compute, overhead - bandwidth / 2,
                             "fp16: half the bytes on the wire (the bandwidth term halves)", now))
    if ops > 1:
        options.append(_gain("train.horovod.fusion_threshold_mb", compute,
                             overhead - (latency - latency / ops),
                             f"fuse the {ops} allreduces into one (threshold ≥ "
                             f"{math.ceil(nbytes / 2**20)} MB)", now))
    cycle = knobs["cycle_time_ms"] / 1000
    transfer = mpi.predict(nbytes, n=n, tensors=ops) if mpi is not None else bandwidth
    floor = CYCLE_FLOOR_LATENCIES * mpi.predict(0, n=n) if mpi is not None else cycle / 2
    shorter = shorter_cycle(step, compute + transfer, cycle, floor)
    if shorter is not None:
        new_cycle, new_step, now_cycles, new_cycles = shorter
        options.append(_gain(
            "train.horovod.cycle_time_ms", compute, new_step - compute,
            f"{new_cycle * 1000:g}: a step waits for whole cycles of Horovod's background thread "
            f"({now_cycles} of {cycle * 1000:g} ms now, {new_cycles} of {new_cycle * 1000:g} ms "
            f"then); not below {floor * 1000:.2g} ms, {CYCLE_FLOOR_LATENCIES}x MPI's "
            "small-message latency, which every cycle's coordination pays", now))
    return options


# The batch and accumulation advice aims here: the smallest power-of-two multiple of the
# per-rank work predicted to reach this fraction of the no-communication limit (the model: k
# times the computation per allreduce, the same overhead), up to MAX_SCALE.
TARGET_OF_LIMIT = 0.90
MAX_SCALE = 64


def scale_to_reach(compute: float, overhead: float, target: float = TARGET_OF_LIMIT,
                   most: int = MAX_SCALE) -> int:
    """The smallest power of two k >= 2 with k*compute / (k*compute + overhead) >= target, or
    ``most`` when none up to it does."""
    k = 2
    while k < most and k * compute < target * (k * compute + overhead):
        k *= 2
    return k


# A cycle of Horovod's background thread is at least this many MPI small-message latencies:
# every cycle the ranks coordinate (one small allreduce), on cores the training shares. On the
# local cluster (2 ranks, 2 cores, 15 us latency) 0.5 ms cycles shortened 2-cycle steps as the
# rule below predicts; 0.25 and 0.1 ms made them longer than 1 ms cycles did.
CYCLE_FLOOR_LATENCIES = 20


def shorter_cycle(step: float, work: float, cycle: float, floor: float):
    """A shorter cycle time for steps that wait for whole cycles, or None.

    A step's gradients leave on the background thread's next cycle, so a step whose
    computation and transfer take ``work`` lasts about ceil(work / cycle) cycles; the measured
    ``step`` against that count gives how much longer the real cycles run (the coordination and
    the thread's wake-up). Halving the cycle (down to ``floor``) cuts the rounding. Returns
    (cycle, predicted step, cycles now, cycles then) for the best candidate that predicts a
    shorter step."""
    if cycle <= 0 or work <= 0 or step <= 0:
        return None
    now_cycles = max(1, math.ceil(work / cycle))
    stretch = step / (now_cycles * cycle)
    best = None
    candidate = cycle / 2
    while candidate >= floor and candidate >= 1e-5:
        cycles = max(1, math.ceil(work / candidate))
        predicted = cycles * candidate * stretch
        if predicted < step and (best is None or predicted < best[1]):
            best = (candidate, predicted, now_cycles, cycles)
        candidate /= 2
    return best


def dominates_at(model, nbytes: float, ops: int, compute: float) -> int | None:
    """The fewest ranks at which the model's communication per step passes ``compute``
    (weak scaling: the computation per step stays the same), or None below 100,000."""
    if compute <= 0:
        return None
    n = 2
    while n <= 100000:
        if model.predict(nbytes, n=n, tensors=ops) >= compute:
            return n
        n = n + 1 if n < 64 else int(n * 1.25)
    return None
