"""Timing one collective across ranks: what `hpcsuite bench allreduce` and the job's fabric
preflight both measure with, so their figures are the same measurement.

mpi4py is imported inside the function (the caller started MPI)."""

from __future__ import annotations

import statistics
import time

MAX_ITERATIONS = 100_000


def _calls(op, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        op()
    return time.perf_counter() - start


def time_op(op, comm, budget_s: float, repeats: int, warmup: int) -> dict:
    """Median over ``repeats`` runs of the slowest rank's mean seconds per call of ``op`` (a
    collective every rank calls), with about ``budget_s`` seconds of timed calls in all.

    Every count is agreed on through the slowest rank's time, so all ranks make the same number
    of calls. After ``warmup`` calls (the first touches fresh pages and builds Horovod's cache
    entry) the count doubles until a batch takes a tenth of a run, as timeit's autorange does;
    each run's count then comes from the previous run, so one slow spell on a shared machine
    cannot stretch the sweep far past its budget."""
    from mpi4py import MPI

    _calls(op, warmup)
    per_run = budget_s / repeats
    count = 1
    while True:
        took = comm.allreduce(_calls(op, count), op=MPI.MAX)
        if took >= per_run / 10 or count >= MAX_ITERATIONS:
            break
        count *= 2
    per_call = took / count
    runs, counts = [], []
    for _ in range(repeats):
        count = int(max(1, min(MAX_ITERATIONS, per_run / max(per_call, 1e-9))))
        comm.Barrier()
        per_call = comm.allreduce(_calls(op, count) / count, op=MPI.MAX)
        runs.append(per_call)
        counts.append(count)
    return {"seconds": float(statistics.median(runs)), "iterations": sum(counts),
            "repeats_s": runs}
