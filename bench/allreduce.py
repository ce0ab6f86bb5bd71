"""Horovod's allreduce against MPI's own (mpi4py) on the local Slurm cluster, through
`hpcsuite bench allreduce`: bus bandwidth of both per size, and their ratio.

    .venv/bin/python bench/allreduce.py [-r 3] [--sizes 4,1K,...] [--private [--port 17217]]
        [--budget SECONDS]

Uses the running local cluster (`hpcsuite cluster up`, or SLURM_CONF) if there is one, else
starts a private one in a temporary directory on --port and stops it afterwards. Each of the R
rounds is one job (both libraries on the same allocation: MPI, Horovod, MPI); per size the table shows
the median over rounds of each library's time as busbw = S/t * 2(N-1)/N, their ratio, and the
range of the ratio over the rounds. The summary line is what docs/BENCHMARKS.md records.
--budget bounds the whole run (cluster start included); --size-budget is the measuring time
per size and library inside each job (`hpcsuite bench allreduce --budget`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from budget import Budget, cancel_jobs_under, run_group
from hpcsuite.alphabeta import FitError, bus_bandwidth, fit
from hpcsuite.allreduce_sizes import format_size


@contextlib.contextmanager
def cluster_env(port: int, private: bool):
    """Slurm client environment for a running cluster, or for one started here."""
    from hpcsuite.site.cluster import LocalCluster, cluster_dir

    running = LocalCluster(cluster_dir())
    conf = os.environ.get("SLURM_CONF") or (str(running.conf) if running.running() else None)
    if conf and not private:
        print(f"using the running cluster ({conf})", file=sys.stderr)
        yield dict(os.environ, SLURM_CONF=conf)
        return
    root = Path(tempfile.mkdtemp(prefix="hpcsuite-bench-cluster-"))
    cluster = LocalCluster(root, port=port)
    print(f"starting a private cluster in {root} (port {port})", file=sys.stderr)
    try:
        cluster.up(timeout=90)
        yield dict(os.environ, SLURM_CONF=str(cluster.conf), HPCSUITE_CLUSTER_DIR=str(root))
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def one_round(env: dict, work: Path, sizes: str | None, budget: float) -> dict:
    argv = [sys.executable, "-m", "hpcsuite", "bench", "allreduce", "--json",
            "--budget", f"{budget:g}", "--output-dir", str(work / "runs")]
    if sizes:
        argv += ["--sizes", sizes]
    out = run_group(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"hpcsuite bench allreduce failed (exit {out.returncode}):\n"
                         f"{out.stdout}{out.stderr}")
    return json.loads(out.stdout)["allreduce"]


def rate(bps: float) -> str:
    for unit, factor in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= factor:
            return f"{bps / factor:.3g} {unit}"
    return f"{bps:.3g} B/s"


def seconds(s: float) -> str:
    return f"{s * 1e6:.3g} us" if s < 1e-3 else f"{s * 1e3:.3g} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", "--rounds", type=int, default=3, help="jobs to run (default 3)")
    ap.add_argument("--sizes", default=None, help="as `hpcsuite bench allreduce --sizes`")
    ap.add_argument("--size-budget", type=float, default=0.4,
                    help="seconds per size and library in each job (default 0.4)")
    Budget.add_argument(ap, 900, "rounds")
    ap.add_argument("--private", action="store_true",
                    help="start a private cluster even when one is running")
    ap.add_argument("--port", type=int, default=17217, help="port of a private cluster")
    ap.add_argument("--json", action="store_true", help="print the rounds' reports as JSON")
    a = ap.parse_args()
    budget = Budget.from_args(a)
    load = os.getloadavg()[0]
    reports = []
    with budget.watch(), cluster_env(a.port, a.private) as env, \
            tempfile.TemporaryDirectory() as tmp:
        try:
            for i in budget.each(range(a.rounds)):
                t0 = time.monotonic()
                reports.append(one_round(env, Path(tmp), a.sizes, a.size_budget))
                print(f"round {i + 1}/{a.rounds}: {time.monotonic() - t0:.1f}s", file=sys.stderr)
        finally:
            if budget.stopped_by:
                cancel_jobs_under(env, tmp)
    budget.report(len(reports), a.rounds, "rounds", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(reports, indent=2))
        sys.exit(budget.exit_code())
    n = reports[0]["world_size"]
    sizes = reports[0]["sizes"]
    print(f"{n} ranks on {', '.join(reports[0]['hosts'])}; {len(reports)} rounds; "
          f"load average before: {load:.2f}; {reports[0]['versions']['mpi']}")
    print(f"{'size':>8}  {'Horovod t':>10}  {'Horovod busbw':>13}  {'MPI t':>10}  "
          f"{'MPI busbw':>11}  {'Horovod/MPI':>11}  round range")
    ratios = []
    medians: dict[str, list[float]] = {"horovod": [], "mpi": []}
    for i, size in enumerate(sizes):
        t = {lib: statistics.median(r["points"][i][f"{lib}_s"] for r in reports)
             for lib in medians}
        for lib in medians:
            medians[lib].append(t[lib])
        ratio = t["mpi"] / t["horovod"]          # = busbw(Horovod) / busbw(MPI)
        ratios.append(ratio)
        per_round = [r["points"][i]["busbw_ratio"] for r in reports]
        busbw = {lib: rate(float(bus_bandwidth(size, t[lib], n))) for lib in t}
        print(f"{format_size(size):>8}  {seconds(t['horovod']):>10}  {busbw['horovod']:>13}  "
              f"{seconds(t['mpi']):>10}  {busbw['mpi']:>11}  {ratio:>11.3f}  "
              f"{min(per_round):.3f}-{max(per_round):.3f}")
    print(f"median over sizes of Horovod/MPI busbw: {statistics.median(ratios):.3f}")
    big = sizes[-1]
    print(f"largest size ({format_size(big)}): Horovod "
          f"{rate(float(bus_bandwidth(big, medians['horovod'][-1], n)))}, MPI "
          f"{rate(float(bus_bandwidth(big, medians['mpi'][-1], n)))}")
    for lib, label in (("horovod", "Horovod"), ("mpi", "MPI")):
        try:
            print(f"fit {label}: {fit(sizes, medians[lib], n).in_words()}")
        except FitError as e:
            print(f"fit {label}: none ({e})")
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
