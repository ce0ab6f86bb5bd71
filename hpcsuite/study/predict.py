"""Predicted data-parallel scaling on a described fabric: the step model behind `study predict`.

Pure arithmetic (the standard library only). One optimizer step of Horovod data parallelism on
N = nodes x gpus_per_node GPUs, each computing the same per-GPU batch:

* **compute.** ``step_s`` is one micro-batch on one GPU (forward, backward, optimizer); the
  backward pass is its last ``backward_fraction`` (2/3 unless measured). With gradient
  accumulation k the GPU computes k micro-batches, and the gradients are exchanged once,
  during the last one's backward pass. Where a rank's compute was measured on the allocation
  itself (a study's no-communication limit there: :mod:`hpcsuite.study.predict_basis`), that
  replaces ``step_s`` at that node count; the efficiency stays against one GPU.
* **gradients become ready** uniformly by bytes over that backward pass (reverse layer order;
  whole tensors when their count is known). G bytes in float32, G/2 with fp16 compression.
* **Horovod's background thread** wakes every ``cycle_ms`` (ticks from the step's start); when
  it is free and some ready bytes are unsent, it sends all of them in that cycle: fused into
  allreduces of at most the fusion threshold (one tensor each with fusion off), one after
  another, and is busy until the last ends.
* **an allreduce** of S bytes (:func:`allreduce_s`): one flat ring over all N GPUs, or
  hierarchical (two levels). The step ends when both the computation and the last allreduce
  have: step = max(k x step_s, last allreduce's end).
* **steps back to back** (:func:`steady_step_s`, what :func:`point` reports): the cycle keeps
  its own clock, so the next step's ticks sit where this step's last allreduce left them.

* **the slowest rank** (:func:`slowest_factor`): the ranks meet at every allreduce, so a step's
  computation is the slowest of N ranks'. Each rank's compute per micro-batch is taken as
  independent and normal around ``step_s`` with coefficient of variation ``compute_cv``
  (per rank, per step); the slowest of N then takes step_s x (1 + cv/sqrt(k) x e_N) in
  expectation, e_N the expected largest of N standard normals (:func:`expected_max_normal`:
  0 for one rank, 0.56 for 2, 2.59 for 128, 3.04 for 512), and its gradients become ready
  that much later. cv 0 is every rank equally fast.

Efficiency(N) = throughput(N) / (N x throughput(1 GPU)) = k x step_s / step(N).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache

from ..fabrics import Fabric

MiB = 1024 * 1024


@dataclass(frozen=True)
class Workload:
    """What one GPU does: ``gradient_bytes`` (float32) per step, ``step_s`` per micro-batch of
    ``batch`` samples (the mean over ranks and steps); ``tensors``: how many gradient tensors
    (needed with fusion off); ``compute_cv``: the coefficient of variation of one rank's
    compute per micro-batch (:func:`slowest_factor`)."""

    gradient_bytes: float
    step_s: float
    batch: int
    backward_fraction: float = 2 / 3
    tensors: int | None = None
    compute_cv: float = 0.0


@dataclass(frozen=True)
class Knobs:
    """The settings the model varies: Horovod's cycle and fusion, fp16 compression, gradient
    accumulation, hierarchical allreduce."""

    cycle_ms: float = 1.0
    fusion_mb: float = 64.0
    fp16: bool = False
    accumulation: int = 1
    hierarchical: bool = False

    def label(self) -> str:
        return (f"cycle {self.cycle_ms:g} ms, fusion {self.fusion_mb:g} MB, "
                f"{'fp16' if self.fp16 else 'fp32'} gradients, accumulation {self.accumulation}, "
                f"{'hierarchical' if self.hierarchical else 'flat'} allreduce")


# The per-rank compute spread `study predict` assumes when it is given none and measured none:
# Sinha et al., "Not All GPUs Are Created Equal" (arXiv:2208.11035v3; SC'22) find an 8 % average
# performance variation among GPUs of one SKU in five clusters (outliers, up to 1.5x slower,
# apart; the SC'22 abstract gives 32 %, max 72 %, over four of them). Read as the
# whisker-to-whisker range of their box plots, a normal spread's range is
# 2 x 2.698 sigma (Q3 + 1.5 IQR = 0.6745 + 1.5 x 1.349 sigma), so sigma/mean = 0.08 / 5.396.
# It is variation between GPUs, which a step pays like jitter: the same GPU is the slowest
# each step. Step-to-step jitter on top of it would add in quadrature; none is assumed.
DEFAULT_COMPUTE_CV = 0.08 / (2 * 2.698)


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: the integral of x n phi(x) Phi(x)^(n-1) over
    x, by Simpson's rule on [-12, 12] in steps of 0.002 (Phi^(n-1) as exp((n-1) log Phi), Phi
    from erfc, so that it holds for n up to 10^9). 0 for n = 1; 1/sqrt(pi) for n = 2; grows
    like sqrt(2 ln n)."""
    if n < 1:
        raise ValueError(f"the largest of {n} ranks")
    if n == 1:
        return 0.0
    lo, hi, steps = -12.0, 12.0, 12_000
    h, total = (hi - lo) / steps, 0.0
    for i in range(steps + 1):
        x = lo + i * h
        tail = 0.5 * math.erfc(x / math.sqrt(2))               # 1 - Phi(x), exact for large x
        log_cdf = math.log1p(-tail) if x > 0 else math.log(0.5 * math.erfc(-x / math.sqrt(2)))
        density = n * math.exp(-x * x / 2 + (n - 1) * log_cdf) / math.sqrt(2 * math.pi)
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * x * density
    return total * h / 3


def slowest_factor(cv: float, ranks: int, accumulation: int = 1) -> float:
    """The slowest of ``ranks`` ranks' compute per optimizer step over the mean one's:
    1 + cv / sqrt(k) x e_N. With accumulation k a rank's step is k independent micro-batches,
    whose sum varies by cv / sqrt(k) of its mean."""
    if not 0 <= cv < 1:
        raise ValueError(f"compute cv {cv} is not in [0, 1)")
    if cv == 0 or ranks < 2:
        return 1.0
    return 1 + cv / math.sqrt(accumulation) * expected_max_normal(ranks)


def pooled_cv(per_rank: list[list[float]]) -> tuple[float, int] | None:
    """The per-step coefficient of variation of compute, pooled over ranks, and how many steps
    it rests on: each rank's steps as deviations from that rank's own median, relative to it
    (a rank persistently slower than the others is not step-to-step spread), and sigma from
    their median absolute value (x 1.4826, 1 / the normal's upper quartile): a normal's
    spread, which the slowest-of-N model assumes. Rare steps many times the median (a
    checkpoint, a stalled core) would dominate a root mean square (measured on the local
    cluster: one 34.9 ms step among 40 of 0.37 ms gives 14.6) and are left out here. Ranks
    with fewer than two positive steps are left out; None when none is left."""
    deviations = []
    for times in per_rank:
        times = [t for t in times if t > 0]
        if len(times) < 2:
            continue
        middle = statistics.median(times)
        deviations += [abs(t - middle) / middle for t in times]
    if not deviations:
        return None
    return statistics.median(deviations) / statistics.NormalDist().inv_cdf(0.75), \
        len(deviations)


def ring_s(nbytes: float, ranks: int, bandwidth_Bps: float, steps_latency_s: float) -> float:
    """A ring allreduce: 2(n-1)/n x S / B on the wire, plus its steps' latency."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth_Bps + steps_latency_s


def allreduce_s(nbytes: float, nodes: int, gpus_per_node: int, fabric: Fabric,
                hierarchical: bool) -> float:
    """Seconds for one allreduce of ``nbytes`` over nodes x gpus_per_node GPUs.

    Flat: one ring over all N GPUs. Its slowest link sets the bandwidth (the network once there
    are two nodes); of its 2(N-1) steps, 2(nodes-1) cross the network and the rest stay inside
    a node (NCCL's own latency model). Hierarchical (HOROVOD_HIERARCHICAL_ALLREDUCE, as Horovod's
    NCCL implementation does it): reduce-scatter inside the node, an allreduce across nodes of
    each GPU's 1/g shard (g shards side by side share the node's network, so the network
    carries S per node), allgather inside the node. Every allreduce pays the fabric's base
    latency once (NCCL's for the presets)."""
    n = nodes * gpus_per_node
    if n < 2 or nbytes <= 0:
        return 0.0
    inter, intra = fabric.inter, fabric.intra_link()
    base = fabric.base_latency_us * 1e-6
    if not (hierarchical or fabric.two_level) or nodes == 1 or gpus_per_node == 1:
        link = inter if nodes > 1 else intra
        cross = 2 * (nodes - 1)
        latency = cross * inter.latency_s + (2 * (n - 1) - cross) * intra.latency_s
        return base + ring_s(nbytes, n, link.bandwidth_Bps, latency)
    g = gpus_per_node
    inside = (g - 1) / g * nbytes / intra.bandwidth_Bps + (g - 1) * intra.latency_s
    across = ring_s(nbytes, nodes, inter.bandwidth_Bps, 2 * (nodes - 1) * inter.latency_s)
    return base + 2 * inside + across


def chunk_limit(workload: Workload, knobs: Knobs) -> float:
    """The most bytes one allreduce carries: the fusion threshold, or one tensor with fusion
    off."""
    if knobs.fusion_mb > 0:
        return knobs.fusion_mb * MiB
    if workload.tensors:
        return workload.gradient_bytes * (0.5 if knobs.fp16 else 1.0) / workload.tensors
    raise ValueError("fusion off needs the number of gradient tensors")


def allreduces(workload: Workload, nodes: int, gpus_per_node: int, fabric: Fabric,
               knobs: Knobs, phase_s: float = 0.0) -> list[tuple[float, float, float]]:
    """(start, end, bytes) of each allreduce of one step, as Horovod's background thread makes
    them: at each cycle tick at which it is free and some gradient bytes are ready but unsent,
    it sends them, up to the fusion threshold, and is busy until that allreduce ends. Bytes
    are ready uniformly over the last micro-batch's backward pass (whole tensors when the
    tensor count is known). The ticks fall at ``phase_s`` + k cycles from the step's start
    (0: a step that starts on a tick; :func:`steady_step_s` finds the phase of steps run back
    to back)."""
    total = workload.gradient_bytes * (0.5 if knobs.fp16 else 1.0)
    backward = workload.backward_fraction * workload.step_s
    start = knobs.accumulation * workload.step_s - backward
    limit, cycle = chunk_limit(workload, knobs), knobs.cycle_ms / 1000
    tensors = workload.tensors

    def ready(t: float) -> float:
        if backward <= 0:                      # everything at once, when compute ends
            share = 1.0 if t >= start - 1e-12 else 0.0
        else:
            share = min(1.0, max(0.0, (t - start) / backward))
        return math.floor(share * tensors + 1e-9) / tensors * total if tensors else share * total

    def tick(t: float) -> float:
        return phase_s + math.ceil((t - phase_s) / cycle - 1e-9) * cycle if cycle > 0 else t

    out, sent, free = [], 0.0, 0.0
    while sent < total * (1 - 1e-12):
        t = tick(free)
        if ready(t) <= sent * (1 + 1e-12):     # nothing new yet: wait for the next tensor
            share = (math.floor(sent / total * tensors + 1e-9) + 1) / tensors if tensors \
                else sent / total + 1e-9
            t = tick(max(free, start + backward * min(1.0, share)))
        # Everything ready at the tick goes in this cycle, in allreduces of at most the
        # threshold (a tensor each with fusion off), one after another (Horovod's
        # RunLoopOnce performs every response of the cycle's list before it sleeps).
        batch, free = ready(t) - sent, t
        while batch > total * 1e-12:
            size = min(batch, limit)
            end = free + allreduce_s(size, nodes, gpus_per_node, fabric, knobs.hierarchical)
            out.append((free, end, size))
            free, sent, batch = end, sent + size, batch - size
    return out


def cycle_start(ops: list[tuple[float, float, float]]) -> float:
    """When the cycle of the last allreduce started: the first of the allreduces that ran one
    after another up to it."""
    i = len(ops) - 1
    while i > 0 and ops[i - 1][1] == ops[i][0]:
        i -= 1
    return ops[i][0]


def step_s(workload: Workload, nodes: int, gpus_per_node: int, fabric: Fabric,
           knobs: Knobs, phase_s: float = 0.0) -> float:
    """Seconds per optimizer step on nodes x gpus_per_node GPUs (see the module's model), the
    cycle's ticks at ``phase_s`` + k cycles from the step's start."""
    compute_end = knobs.accumulation * workload.step_s
    if nodes * gpus_per_node < 2 or workload.gradient_bytes <= 0:
        return compute_end
    ops = allreduces(workload, nodes, gpus_per_node, fabric, knobs, phase_s)
    return max(compute_end, ops[-1][1])


def steady_step_s(workload: Workload, nodes: int, gpus_per_node: int, fabric: Fabric,
                  knobs: Knobs, steps: int = 16, settle: int = 4) -> float:
    """Seconds per step once steps run back to back: the mean of ``steps`` simulated steps
    after ``settle`` more.

    Horovod's cycles keep their own clock (``RunLoopOnce`` in horovod/common/operations.cc
    sleeps until the previous cycle's start plus the cycle time, at once when that cycle ran
    longer) and an allreduce runs inside the cycle that starts it. A step starts when the
    previous one ends (its last allreduce, or its computation), not on a tick: the ticks sit
    where the last allreduce's cycle left them, so each step lasts about whole cycles (on
    this machine 2.13 ms = two cycles of ~1.07 ms at batch 128, against 1.08 ms with no
    allreduce: docs/BENCHMARKS.md, "Fourth run"). :func:`step_s` (ticks from the step's
    start) is the first step; this carries the phase from step to step."""
    cycle = knobs.cycle_ms / 1000
    if nodes * gpus_per_node < 2 or workload.gradient_bytes <= 0 or cycle <= 0:
        return step_s(workload, nodes, gpus_per_node, fabric, knobs)
    lengths = _back_to_back(lambda: workload, settle + steps, nodes, gpus_per_node, fabric,
                            knobs)
    return sum(lengths[settle:]) / steps


def sampled_step_s(workload: Workload, computes: list[float], nodes: int, gpus_per_node: int,
                   fabric: Fabric, knobs: Knobs, steps: int = 2000, settle: int = 50,
                   seed: int = 0) -> float:
    """The mean step, back to back, when the computation varies from step to step.

    ``computes`` are measured seconds per micro-batch of one rank (a job's step times, each
    rank's). Each simulated step draws one of them for every one of the N ranks, and the
    slowest sets the step: the ranks meet at the allreduce (Horovod's coordinator starts it
    once every rank has asked for it). The cycle's phase carries from step to step as in
    :func:`steady_step_s`. A computation that varies crosses more cycle boundaries than its
    median would, and N ranks wait for the slowest of N draws: both lengthen the step beyond
    what one fixed computation gives. Deterministic (``seed``); with one value it is
    :func:`steady_step_s`."""
    if not computes:
        raise ValueError("no measured computation to draw from")
    if min(computes) == max(computes):
        return steady_step_s(replace(workload, step_s=computes[0]), nodes, gpus_per_node,
                             fabric, knobs)
    rng, ranks = random.Random(seed), nodes * gpus_per_node
    draw = lambda: replace(workload, step_s=max(rng.choice(computes) for _ in range(ranks)))
    if ranks < 2 or workload.gradient_bytes <= 0 or knobs.cycle_ms <= 0:
        lengths = [step_s(draw(), nodes, gpus_per_node, fabric, knobs)
                   for _ in range(settle + steps)]
    else:
        lengths = _back_to_back(draw, settle + steps, nodes, gpus_per_node, fabric, knobs)
    return sum(lengths[settle:]) / steps


def _back_to_back(workload_of_step, count: int, nodes: int, gpus_per_node: int,
                  fabric: Fabric, knobs: Knobs) -> list[float]:
    """The lengths of ``count`` steps run back to back, each step's workload from
    ``workload_of_step()``, the cycle's phase carried from one to the next."""
    cycle = knobs.cycle_ms / 1000
    phase, lengths = 0.0, []
    for _ in range(count):
        workload = workload_of_step()
        ops = allreduces(workload, nodes, gpus_per_node, fabric, knobs, phase)
        end, start = ops[-1][1], cycle_start(ops)
        length = max(knobs.accumulation * workload.step_s, end)
        lengths.append(length)
        # The next cycle starts a cycle after the last one's start, or when it ends if longer.
        anchor = start if end - start < cycle else end
        phase = (anchor - length) % cycle
    return lengths


def point(workload: Workload, nodes: int, gpus_per_node: int, fabric: Fabric,
          knobs: Knobs, compute_s: float | None = None) -> dict:
    """One row: step, throughput (samples/s) and efficiency at one node count, steps run back
    to back (:func:`steady_step_s`), every rank's computation the slowest rank's
    (:func:`slowest_factor`); the efficiency is against one GPU at its mean compute.
    ``compute_s``: a rank's mean compute per micro-batch on this allocation where it was
    measured there (ranks beside each other can compute more slowly than one alone), else the
    workload's ``step_s``."""
    gpus = nodes * gpus_per_node
    compute = workload.step_s if compute_s is None else compute_s
    slowest = replace(workload, step_s=compute * slowest_factor(
        workload.compute_cv, gpus, knobs.accumulation))
    step = steady_step_s(slowest, nodes, gpus_per_node, fabric, knobs)
    samples = gpus * knobs.accumulation * workload.batch
    return {"nodes": nodes, "gpus": gpus, "step_ms": step * 1000,
            "throughput": samples / step,
            "efficiency": knobs.accumulation * workload.step_s / step,
            "slowest_compute_ms": knobs.accumulation * slowest.step_s * 1000}


def alternatives(knobs: Knobs, workload: Workload, gpus_per_node: int) -> dict[str, Knobs]:
    """The knob settings compared with ``knobs``: each one changed alone."""
    out = {"current": knobs}
    if not knobs.fp16:
        out["fp16 compression"] = replace(knobs, fp16=True)
    out[f"accumulation {knobs.accumulation * 4}"] = replace(knobs, accumulation=knobs.accumulation * 4)
    if knobs.fusion_mb != 128:
        out["fusion 128 MB"] = replace(knobs, fusion_mb=128.0)
    if knobs.fusion_mb and workload.tensors:
        out["fusion off"] = replace(knobs, fusion_mb=0.0)
    if knobs.cycle_ms > 0.5:
        out["cycle 0.5 ms"] = replace(knobs, cycle_ms=0.5)
    if knobs.cycle_ms < 5:
        out["cycle 5 ms"] = replace(knobs, cycle_ms=5.0)
    if gpus_per_node > 1:
        out["hierarchical" if not knobs.hierarchical else "flat"] = replace(
            knobs, hierarchical=not knobs.hierarchical)
    return out


# A knob is named as helping only when it gains at least this much efficiency at the largest
# node count: a gain that the table prints as +0.000 (or that the model's own error dwarfs)
# would send a user after a change that buys nothing.
HELPS = 0.005


def predict(workload: Workload, nodes: list[int], gpus_per_node: int, fabric: Fabric,
            knobs: Knobs, threshold: float = 0.8, spread_source: str = "",
            computes: dict[int, float] | None = None) -> dict:
    """Every knob setting at every node count, the knob that helps most at the largest node
    count (if any gains :data:`HELPS` or more), and the first node count where the current
    settings' efficiency is below ``threshold``; ``spread_source`` says where the workload's
    ``compute_cv`` came from; ``computes``: node count -> a rank's compute per micro-batch
    measured on that many nodes (:func:`point`'s ``compute_s``)."""
    computes = computes or {}
    settings = alternatives(knobs, workload, gpus_per_node)
    series = {name: [point(workload, n, gpus_per_node, fabric, k, computes.get(n))
                     for n in nodes] for name, k in settings.items()}
    now = series["current"][-1]["efficiency"]
    gains = {name: rows[-1]["efficiency"] - now for name, rows in series.items()
             if name != "current"}
    best = max(gains, key=gains.get, default=None)
    if best is not None and gains[best] < HELPS:
        best = None
    below = next((r["nodes"] for r in series["current"] if r["efficiency"] < threshold), None)
    return {"fabric": fabric.in_words(), "gpus_per_node": gpus_per_node,
            "workload": {"gradient_bytes": workload.gradient_bytes,
                         "step_ms": workload.step_s * 1000, "batch": workload.batch,
                         "backward_fraction": workload.backward_fraction,
                         "tensors": workload.tensors, "compute_cv": workload.compute_cv,
                         "compute_cv_source": spread_source,
                         "compute_ms_at_nodes": {str(n): computes[n] * 1000 for n in nodes
                                                 if n in computes}},
            "knobs": {name: k.label() for name, k in settings.items()},
            "series": series, "threshold": threshold, "below_threshold_at_nodes": below,
            "best_knob": ({"knob": best, "efficiency": series[best][-1]["efficiency"],
                           "gain": gains[best], "at_nodes": nodes[-1]}
                          if best is not None else None)}
