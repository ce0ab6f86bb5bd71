"""`hpcsuite bench allreduce` on every rank: Horovod's allreduce against MPI's own.

The command submits a script-mode job whose ``train.script`` is this file, so it runs on
every rank the way a user's training script does (``hpcsuite train`` sets HPCSUITE_JOB and
HPCSUITE_RUN_DIR, ``train.args`` are its argv). It also runs by hand under a launcher::

    mpirun -np 2 python hpcsuite/runtime/checks/allreduce_bench.py --sizes 4K,1M

For each size (bytes of a float32 tensor) and each library it checks one allreduce (sum of
rank+1 on every element), warms up, then times ``repeats`` runs of back-to-back calls after a
barrier; a run's time is the slowest rank's mean per call and the result is the median run.
The calls per run adapt so that the runs take about ``--budget`` seconds in all (``iterations``
in the report: calls timed per rank), so a whole sweep stays well under a minute on a small
machine. MPI is timed in two passes of half the budget, before ``hvd.init()`` and after
``hvd.shutdown()``, and its result is the median of both passes' runs (``mpi_passes_s``: each
pass's median), so a machine that gets busier or quieter meanwhile weighs on both alike.

Both sides reduce in place, as Horovod's DistributedOptimizer does with gradients:
``hvd.allreduce_(tensor, op=hvd.Sum)`` on a CPU torch tensor, and
``comm.Allreduce(MPI.IN_PLACE, array)`` through mpi4py, which is also the MPI call Horovod
makes underneath; so the ratio is what Horovod adds (its background cycle, negotiation,
copies) on the same allocation and the same MPI. A lone Horovod allreduce waits for the next
cycle of Horovod's background thread (``train.horovod.cycle_time_ms``, 1 ms by default),
which sets its latency floor; in training many gradients share one cycle.

Rank 0 writes ``allreduce.json`` and ``allreduce.csv`` into the run directory; times in
seconds, bandwidths in bytes/s, algbw = S/t and busbw = algbw·2(N−1)/N (nccl-tests).

An entry point, not a library: the login side builds this job
(:mod:`hpcsuite.study.allreduce_job`) and shares the ``--sizes`` syntax and the defaults with
it through :mod:`hpcsuite.allreduce_sizes`. Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# Run as a script (runpy.run_path): absolute imports only.
from hpcsuite.allreduce_sizes import DEFAULT_BUDGET_S, DEFAULT_SIZES, format_size, parse_sizes
from hpcsuite.runs.results import write_json_atomic  # noqa: E402
from hpcsuite.runs.rundir import ALLREDUCE as REPORT, ALLREDUCE_CSV as CSV  # noqa: E402
from hpcsuite.runtime.checks.collective_timing import time_op  # noqa: E402
from hpcsuite.runtime.rank.shm import private_shm  # noqa: E402
from hpcsuite.world import current  # noqa: E402
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2

CSV_COLUMNS = ("bytes", "horovod_s", "mpi_s", "horovod_busbw", "mpi_busbw", "busbw_ratio",
               "horovod_algbw", "mpi_algbw", "horovod_iterations", "mpi_iterations")


def write_csv(report: dict, path: Path) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for p in report["points"]:
            row = {**p, "horovod_iterations": p["iterations"]["horovod"],
                   "mpi_iterations": p["iterations"]["mpi"]}
            w.writerow([row[c] for c in CSV_COLUMNS])


# ------------------------------------------------------------------ measuring (ranks)
def _check(label: str, size: int, got: float, n: int) -> None:
    expected = n * (n + 1) / 2
    if got != expected:
        raise RuntimeError(f"{label} allreduce of {format_size(size)} gave {got}, expected "
                           f"{expected} (sum of rank+1 over {n} ranks)")


def measure_mpi(comm, sizes, budget_s, repeats, warmup) -> dict[int, dict]:
    import numpy as np
    from mpi4py import MPI

    out = {}
    for size in sizes:
        buf = np.full(size // 4, comm.rank + 1, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        _check("MPI", size, float(buf.min()), comm.size)
        _check("MPI", size, float(buf.max()), comm.size)
        buf[:] = 0      # zeros stay zeros under repeated sums: no overflow, no denormals

        def op(buf=buf):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        out[size] = time_op(op, comm, budget_s, repeats, warmup)
    return out


def measure_horovod(hvd, comm, sizes, budget_s, repeats, warmup) -> dict[int, dict]:
    import torch

    out = {}
    for size in sizes:
        name = f"hpcsuite.bench.allreduce.{size}"   # a fixed name, as a gradient has
        tensor = torch.full((size // 4,), float(hvd.rank() + 1), dtype=torch.float32)
        hvd.allreduce_(tensor, op=hvd.Sum, name=name)
        _check("Horovod", size, float(tensor.min()), hvd.size())
        _check("Horovod", size, float(tensor.max()), hvd.size())
        tensor.zero_()

        def op(tensor=tensor, name=name):
            hvd.allreduce_(tensor, op=hvd.Sum, name=name)

        out[size] = time_op(op, comm, budget_s, repeats, warmup)
    return out


def merge_passes(before: dict[int, dict], after: dict[int, dict]) -> dict[int, dict]:
    """One result per size from two passes (before and after Horovod): the median of all runs,
    so a machine that got busier or quieter in between weighs on both libraries alike."""
    out = {}
    for size, b in before.items():
        a = after[size]
        runs = b["repeats_s"] + a["repeats_s"]
        out[size] = {"seconds": float(statistics.median(runs)),
                     "iterations": b["iterations"] + a["iterations"], "repeats_s": runs,
                     "passes_s": [b["seconds"], a["seconds"]]}
    return out


def report(sizes, mpi, horovod, n, hosts, settings, versions) -> dict:
    """The allreduce.json content: per size times, bandwidths and iterations, and the fits."""
    from hpcsuite.alphabeta import FitError, algorithm_bandwidth, bus_bandwidth, fit

    points = []
    for size in sizes:
        h, m = horovod[size]["seconds"], mpi[size]["seconds"]
        hb, mb = float(bus_bandwidth(size, h, n)), float(bus_bandwidth(size, m, n))
        points.append({
            "bytes": size, "horovod_s": h, "mpi_s": m, "horovod_busbw": hb, "mpi_busbw": mb,
            "horovod_algbw": float(algorithm_bandwidth(size, h)),
            "mpi_algbw": float(algorithm_bandwidth(size, m)), "busbw_ratio": hb / mb,
            "iterations": {"horovod": horovod[size]["iterations"], "mpi": mpi[size]["iterations"]},
            "repeats_s": {"horovod": horovod[size]["repeats_s"], "mpi": mpi[size]["repeats_s"]},
        })
        if "passes_s" in mpi[size]:
            points[-1]["mpi_passes_s"] = mpi[size]["passes_s"]
    fits = {}
    for key, measured in (("horovod", horovod), ("mpi", mpi)):
        try:
            fits[key] = fit(sizes, [measured[s]["seconds"] for s in sizes], n).to_json()
        except FitError as e:
            fits[key] = {"error": str(e)}
    return {"world_size": n, "hosts": hosts, "sizes": list(sizes), "points": points, "fit": fits,
            "busbw_formula": "busbw = S/t * 2(N-1)/N (bytes/s)", "settings": settings,
            "versions": versions, "job_id": current().job_id}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The command line and its sizes in bytes; argparse's usage error (exit 2) on a bad one."""
    ap = argparse.ArgumentParser(prog="allreduce_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds of timed calls per size and library")
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    a = ap.parse_args(argv)
    if a.budget <= 0 or a.repeats < 1 or a.warmup < 0:
        ap.error("--budget must be > 0, --repeats >= 1, --warmup >= 0")
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        ap.error(f"--sizes: {e}")
    return a, sizes


def measure(sizes: list[int], a: argparse.Namespace):
    """(comm, MPI's times, Horovod's times, every rank's host on rank 0, Horovod's controller).

    MPI, then Horovod, then MPI again (half the budget each time: drift on a shared machine
    weighs on both libraries alike). mpi4py initialises MPI at import with
    MPI_THREAD_MULTIPLE (its default rc.thread_level), which is what Horovod asks for;
    hvd.init() then finds MPI initialised, works on its own duplicate of COMM_WORLD, and
    hvd.shutdown() leaves MPI up for the second pass and for mpi4py to finalise at exit. The
    other order (hvd.init() first, then import mpi4py) also works, but hvd.shutdown() then
    finalises MPI under mpi4py. MPI is never timed while Horovod runs: its background thread
    runs a coordination allreduce every cycle even when idle; in one measurement on the
    project's 2-core machine (plain mpirun, shared memory) it made a 4 KiB comm.Allreduce 8x
    slower (23 -> 193 us) and a 4-byte one 30x (0.9 -> 27 us)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = comm.size
    if n < 2:
        raise SystemExit("allreduce_bench: needs at least 2 ranks (an allreduce over one rank "
                         "communicates nothing)")
    mpi_before = measure_mpi(comm, sizes, a.budget / 2, a.repeats, a.warmup)

    import horovod.torch as hvd

    hvd.init()
    if hvd.size() != n:
        raise RuntimeError(f"Horovod sees {hvd.size()} ranks, MPI {n}")
    horovod_times = measure_horovod(hvd, comm, sizes, a.budget, a.repeats, a.warmup)
    hosts = comm.gather(current().node, root=0)
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    hvd.shutdown()      # MPI stays up: mpi4py initialised it (see above)
    mpi = merge_passes(mpi_before, measure_mpi(comm, sizes, a.budget / 2, a.repeats, a.warmup))
    return comm, mpi, horovod_times, hosts, controller


def versions() -> dict:
    """The versions of what was measured (all imported by then)."""
    import horovod
    import mpi4py
    import numpy as np
    import torch
    from mpi4py import MPI

    library = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    return {"python": sys.version.split()[0], "numpy": np.__version__,
            "torch": torch.__version__, "horovod": horovod.__version__,
            "mpi4py": mpi4py.__version__, "mpi": library}


def write(data: dict, run_dir: Path) -> Path:
    """allreduce.csv, then allreduce.json (atomically): the JSON's presence means both are there."""
    path = run_dir / REPORT
    write_csv(data, run_dir / CSV)
    write_json_atomic(path, data)
    return path


def main(argv: list[str] | None = None) -> dict | None:
    a, sizes = parse_args(argv)
    private_shm()            # before mpi4py starts MPI: nodes sharing a host need their own
    started = time.perf_counter()
    comm, mpi, horovod_times, hosts, controller = measure(sizes, a)
    if comm.rank != 0:
        return None
    settings = {"budget_s": a.budget, "repeats": a.repeats, "warmup": a.warmup,
                "dtype": "float32", "op": "sum", "in_place": True, "order": "mpi, horovod, mpi",
                "horovod_controller": controller,
                "horovod_env": {k: v for k, v in sorted(os.environ.items())
                                if k.startswith("HOROVOD_")},
                "elapsed_s": time.perf_counter() - started}
    data = report(sizes, mpi, horovod_times, comm.size, hosts, settings, versions())
    path = write(data, Path(os.environ.get("HPCSUITE_RUN_DIR") or "."))
    print(f"allreduce bench: {len(sizes)} sizes on {comm.size} ranks in "
          f"{settings['elapsed_s']:.1f}s; wrote {path}", flush=True)
    return data


if __name__ == "__main__":
    main()
