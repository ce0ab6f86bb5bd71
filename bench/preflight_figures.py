"""The fabric preflight's pair busbw against `hpcsuite bench allreduce`'s MPI busbw at the same size,
on the local Slurm cluster: both time MPI's in-place allreduce with the same code
(hpcsuite/runtime/checks/collective_timing.py), so on 2 nodes of 1 rank they should agree within the
machine's run-to-run spread; and the preflight step's own time.

    .venv/bin/python bench/preflight_figures.py [-r 3] [--size-mb 16] [--private [--port 17317]]

Each round submits a job with ``preflight.fabric`` (bar 0.001 GB/s, so it passes and trains 10
steps) and then ``bench allreduce --sizes SIZE`` (MPI before and after Horovod, 0.6 s per pass);
rounds alternate the two, so drift on a shared machine weighs on both. Prints each round and the
medians; the summary line is what docs/BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from allreduce import cluster_env   # bench/allreduce.py: the running or a private cluster

SPEC = """name: pf
resources: {{nodes: 2, tasks_per_node: 1, time: "00:05:00"}}
preflight: {{fabric: {{min_busbw_gbps: 0.001, size_mb: {size}}}}}
train: {{data: {{samples: 512, shape: [16], classes: 4}}, batch_size: 16, max_steps: 10}}
"""


def cli(work: Path, env: dict, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "hpcsuite", *args, "--json"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def one_round(work: Path, env: dict, size_mb: int) -> tuple[float, float, float]:
    """(preflight pair busbw, bench MPI busbw, preflight step seconds)."""
    out = cli(work, env, "submit", "pf.yaml", "--wait")
    record = json.loads((work / "runs" / "pf" / out["job_id"] / "preflight.json").read_text())
    (pair,) = record["fabric"]["pairs"]
    bench = cli(work, env, "bench", "allreduce", "--nodes", "2", "--sizes", f"{size_mb}M",
                "--budget", "0.6")
    (point,) = bench["allreduce"]["points"]
    return pair["busbw_Bps"], point["mpi_busbw"], record["elapsed_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--size-mb", type=int, default=16)
    ap.add_argument("--private", action="store_true")
    ap.add_argument("--port", type=int, default=17317)
    a = ap.parse_args()
    with cluster_env(a.port, a.private) as env, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "pf.yaml").write_text(SPEC.format(size=a.size_mb))
        rows = []
        for r in range(a.rounds):
            t0 = time.monotonic()
            rows.append(one_round(work, env, a.size_mb))
            pre, mpi, step = rows[-1]
            print(f"round {r + 1}: preflight {pre / 1e9:.3f} GB/s, bench MPI {mpi / 1e9:.3f} GB/s, "
                  f"ratio {pre / mpi:.3f}, preflight step {step:.2f} s ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    pre, mpi, step = (statistics.median(c) for c in zip(*rows))
    ratios = [p / m for p, m, _ in rows]
    print(f"summary: {a.size_mb} MiB, {a.rounds} rounds: preflight node1-node2 {pre / 1e9:.3f} GB/s, "
          f"bench allreduce MPI {mpi / 1e9:.3f} GB/s (median ratio {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}); preflight step {step:.2f} s")


if __name__ == "__main__":
    main()
