"""What a virtual node of the local cluster costs this machine (`hpcsuite cluster up --nodes N`):
memory and idle CPU of its daemons, the time to come up, a step on every node, and down.

    .venv/bin/python bench/cluster_nodes.py [--nodes 2,8,32] [--fabric RATE] [--port 17517]
        [--idle 30]

For each N a private cluster starts in a temporary directory on --port (accounting included,
as `cluster up` does), waits until every node is idle, then measures:
  - memory: each slurmd's USS (pages only it holds) and RSS, slurmctld's and the rest's RSS;
  - idle CPU: CPU seconds all slurmd and slurmctld used over --idle seconds with no job;
  - `srun -N N true`: a step on every node, wall seconds;
  - up and down, wall seconds.
Per node figures are fitted as a + b·N over the N run; the N=2 cluster (every test's) is the
baseline the others are compared to, in the same run. Needs root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from hpcsuite.site.cluster import LocalCluster


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares a + b·x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(n: int, port: int, fabric: str | None, idle: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"hpcsuite-bench-{n}-nodes-") as d:
        cluster = LocalCluster(Path(d), port=port, nodes=n, fabric=fabric)
        t0 = time.monotonic()
        try:
            cluster.up(timeout=60 + 3 * n)
            up_s = time.monotonic() - t0
            states = cluster.states()
            slurmd = [pid for name, pid in states.items() if name.startswith("slurmd-")]
            rest = [pid for name, pid in states.items() if not name.startswith("slurmd-")]
            uss = [psutil.Process(p).memory_full_info().uss for p in slurmd]
            rss = [psutil.Process(p).memory_info().rss for p in slurmd]
            ctld = psutil.Process(states["slurmctld"]).memory_info().rss
            others = sum(psutil.Process(p).memory_info().rss for p in rest) - ctld
            watched = slurmd + [states["slurmctld"]]
            c0 = cpu_seconds(watched)
            time.sleep(idle)
            cpu = cpu_seconds(watched) - c0
            env = dict(os.environ, SLURM_CONF=str(cluster.conf))
            t1 = time.monotonic()
            done = subprocess.run(["srun", "-N", str(n), "-n", str(n), "true"], env=env,
                                  capture_output=True, text=True, timeout=120)
            srun_s = time.monotonic() - t1
            if done.returncode != 0:
                sys.exit(f"srun -N {n} true failed: {done.stderr.strip()}")
        finally:
            t2 = time.monotonic()
            cluster.down()
            down_s = time.monotonic() - t2
    return {"n": n, "up_s": up_s, "down_s": down_s, "srun_s": srun_s,
            "uss_mb": sum(uss) / 1e6 / n, "rss_mb": sum(rss) / 1e6 / n, "ctld_mb": ctld / 1e6,
            "others_mb": others / 1e6, "cpu_pct_node": 100 * cpu / idle / n,
            "cpu_pct_all": 100 * cpu / idle}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="2,8,32")
    ap.add_argument("--fabric", default=None)
    ap.add_argument("--port", type=int, default=17517)
    ap.add_argument("--idle", type=float, default=30.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/cluster_nodes.py starts local clusters: run it as root")
    counts = sorted({int(x) for x in args.nodes.split(",")} | {2})
    rows = [measure(n, args.port, args.fabric, args.idle) for n in counts]
    base = rows[0]
    print(f"local cluster, {'--fabric ' + args.fabric if args.fabric else 'loopback'}; "
          f"{os.cpu_count()} cores; idle window {args.idle:g} s")
    print(f"{'N':>3} {'up s':>6} {'srun s':>7} {'down s':>7} {'USS/node MB':>12} "
          f"{'RSS/node MB':>12} {'ctld MB':>8} {'db+munge MB':>12} {'idle CPU %/node':>16} "
          f"{'x N=2':>6}")
    for r in rows:
        ratio = r["cpu_pct_node"] / base["cpu_pct_node"] if base["cpu_pct_node"] else float("nan")
        print(f"{r['n']:>3} {r['up_s']:>6.1f} {r['srun_s']:>7.2f} {r['down_s']:>7.1f} "
              f"{r['uss_mb']:>12.2f} {r['rss_mb']:>12.1f} {r['ctld_mb']:>8.1f} "
              f"{r['others_mb']:>12.1f} {r['cpu_pct_node']:>16.3f} {ratio:>6.2f}")
    if len(rows) > 1:
        ns = [r["n"] for r in rows]
        for key, label in (("up_s", "up (s)"), ("srun_s", "srun -N N true (s)")):
            a, b = fit_line(ns, [r[key] for r in rows])
            print(f"fit {label}: {a:.2f} + {b:.3f}·N")
        a, b = fit_line(ns, [r["uss_mb"] * r["n"] for r in rows])
        print(f"fit slurmd USS, all nodes (MB): {a:.1f} + {b:.2f}·N")
        a, b = fit_line(ns, [r["cpu_pct_all"] for r in rows])
        print(f"fit idle CPU, slurmd + slurmctld (% of one core): {a:.3f} + {b:.4f}·N")


if __name__ == "__main__":
    main()
