"""Weak scaling 1 -> 2 nodes on the local Slurm cluster: hpcsuite against a plain Horovod loop
at the same configuration, and against the no-communication limit, in the same run.

For each per-rank batch (the default study configuration's, then the bigger ones the study
report recommends) and each repeat, alternating, on 1 and on 2 nodes (one rank per node):
  hpcsuite   `hpcsuite submit` of examples/scaling/job.yaml (managed loop, sharded data)
  limit      the same with train.horovod.allreduce=false (no gradient exchange)
  plain      bench/plain_loop.py under the same sbatch allocation and mpirun line
All three run the same steps and report steady-state samples/s with the same warm-up rule.
Prints the medians [min-max] and the ratios: hpcsuite/plain and hpcsuite/limit at 2 nodes,
and the weak-scaling efficiency (2-node throughput / 2 x 1-node throughput).

    .venv/bin/python bench/weak_scaling.py [--backend torch] [--batches 128,512] [-r 3]

Needs the local cluster (`hpcsuite cluster up`); SLURM_CONF is taken from its state.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BASE = ROOT / "examples" / "scaling" / "job.yaml"


def cluster_env() -> dict:
    env = dict(os.environ)
    if "SLURM_CONF" not in env:
        out = subprocess.run([PY, "-m", "hpcsuite", "cluster", "up"], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            if line.startswith("export SLURM_CONF="):
                env["SLURM_CONF"] = line.split("=", 1)[1]
    return env


def hpcsuite_run(env, work: Path, backend: str, nodes: int, batch: int, steps: int,
                 allreduce: bool, cycle: float) -> float:
    sets = [f"train.horovod.cycle_time_ms={cycle:g}", f"resources.nodes={nodes}", f"train.backend={backend}", f"train.batch_size={batch}",
            f"train.max_steps={steps}", "train.epochs=1000000", f"output_dir={work}/runs",
            f"train.horovod.allreduce={'true' if allreduce else 'false'}"]
    argv = [PY, "-m", "hpcsuite", "submit", str(BASE), "--wait", "--json"]
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"hpcsuite job failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)["results"]["samples_per_s_steady"]


PLAIN = """#!/bin/bash
#SBATCH --job-name=plain-weak
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output={out}
export OMP_NUM_THREADS=1 HOROVOD_FUSION_THRESHOLD=67108864 HOROVOD_CYCLE_TIME={cycle:g}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
mpirun -np {nodes} -npernode 1 --map-by slot --bind-to none --mca pml ob1 --mca btl '^openib' \\
  -x PATH -x OMP_NUM_THREADS -x HOROVOD_FUSION_THRESHOLD -x HOROVOD_CYCLE_TIME -x TF_CPP_MIN_LOG_LEVEL \\
  {py} {plain} --backend {backend} --model mlp --shape {shape} --classes 10 --batch {batch} --steps {steps} {fresh}
"""


def plain_run(env, work: Path, backend: str, nodes: int, batch: int, steps: int, shape: int,
              cycle: float, fresh: int | None) -> float:
    out = work / f"plain-{time.monotonic_ns()}.out"
    script = work / "plain.sbatch"
    script.write_text(PLAIN.format(nodes=nodes, out=out, py=PY, plain=ROOT / "bench" / "plain_loop.py",
                                   backend=backend, shape=shape, batch=batch, steps=steps,
                                   cycle=cycle,
                                   fresh=f"--fresh-data --samples {fresh}" if fresh else ""))
    done = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=900)
    text = out.read_text() if out.is_file() else ""
    for line in text.splitlines():
        if line.startswith("{") and "samples_per_s_steady" in line:
            return json.loads(line)["samples_per_s_steady"]
    raise SystemExit(f"plain loop failed (sbatch exit {done.returncode}):\n{text[-2000:]}{done.stderr}")


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):9.0f} [{min(values):.0f}-{max(values):.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], default="torch")
    ap.add_argument("--batches", default="128,512", help="per-rank batches, comma-separated")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--cycle-time", type=float, default=1.0,
                    help="HOROVOD_CYCLE_TIME in ms on both sides (hpcsuite's default: 1)")
    ap.add_argument("--fresh-data", action="store_true",
                    help="the plain loop gathers each step's batch from as many samples in memory "
                         "as the job's dataset (hpcsuite's reads), instead of reusing one batch")
    a = ap.parse_args()
    env = cluster_env()
    import yaml

    data = yaml.safe_load(BASE.read_text())["train"]["data"]
    shape, fresh = data["shape"][0], (data["samples"] if a.fresh_data else None)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="weak-") as tmp:
        work = Path(tmp)
        for batch in [int(b) for b in a.batches.split(",")]:
            for r in range(a.repeats):
                for nodes in (1, 2):
                    key = (batch, nodes)
                    row = results.setdefault(key, {"hpcsuite": [], "limit": [], "plain": []})
                    row["hpcsuite"].append(hpcsuite_run(env, work, a.backend, nodes, batch, a.steps, True, a.cycle_time))
                    row["plain"].append(plain_run(env, work, a.backend, nodes, batch, a.steps, shape,
                                                  a.cycle_time, fresh))
                    if nodes > 1:    # one rank has nothing to exchange: its limit is itself
                        row["limit"].append(hpcsuite_run(env, work, a.backend, nodes, batch, a.steps,
                                                         False, a.cycle_time))
                    limit = f", limit {row['limit'][-1]:.0f}" if row["limit"] else ""
                    print(f"batch {batch} nodes {nodes} repeat {r}: hpcsuite {row['hpcsuite'][-1]:.0f}, "
                          f"plain {row['plain'][-1]:.0f}{limit} samples/s", file=sys.stderr, flush=True)
    print(f"weak scaling, {a.backend}, built-in MLP on {shape}-input samples, one rank per node, "
          f"{a.steps} steps, cycle time {a.cycle_time:g} ms, {a.repeats} alternated repeats "
          "(samples/s median [min-max])")
    if fresh:
        print(f"the plain loop gathers every step's batch from {fresh} samples in memory (--fresh-data)")
    print(f"{'batch':>5} {'nodes':>5} {'hpcsuite':>24} {'plain':>24} {'limit':>24} "
          f"{'hpc/plain':>9} {'hpc/limit':>9} {'plain/limit':>11}")
    for (batch, nodes), row in sorted(results.items()):
        med = {k: statistics.median(v) for k, v in row.items() if v}
        limit = med.get("limit", med["hpcsuite"])
        print(f"{batch:>5} {nodes:>5} {fmt(row['hpcsuite']):>24} {fmt(row['plain']):>24} "
              f"{fmt(row['limit']) if row['limit'] else '(itself)':>24} "
              f"{med['hpcsuite'] / med['plain']:9.3f} "
              f"{med['hpcsuite'] / limit:9.3f} {med['plain'] / limit:11.3f}")
    for batch in sorted({b for b, _ in results}):
        one, two = (statistics.median(results[(batch, n)]["hpcsuite"]) for n in (1, 2))
        p1, p2 = (statistics.median(results[(batch, n)]["plain"]) for n in (1, 2))
        print(f"batch {batch}: weak-scaling efficiency hpcsuite {two / (2 * one):.3f}, "
              f"plain {p2 / (2 * p1):.3f}")
        # The three at 2 nodes ran back to back in each repeat: their ratios share its moment.
        row = results[(batch, 2)]
        for name, other in (("plain", row["plain"]), ("limit", row["limit"])):
            pairs = [h / o for h, o in zip(row["hpcsuite"], other)]
            print(f"batch {batch}, 2 nodes: hpcsuite/{name} per repeat median "
                  f"{statistics.median(pairs):.3f} [{min(pairs):.3f}-{max(pairs):.3f}]")


if __name__ == "__main__":
    main()
