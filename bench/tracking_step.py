"""A managed job's throughput with MLflow tracking on against off (issue 37 point 4).

The same `hpcsuite train` (bench/train_overhead.py's job: the built-in model, synthetic data,
`mpirun -np 2`, one thread a rank) with and without ``train.tracking: {mlflow: {uri: file:...}}``,
alternating which goes first, R times. Tracking imports mlflow (seconds of CPU) and sends its
points from a thread of rank 0's process, so short jobs are its worst case: the import overlaps
the whole run. Prints each side's steady samples/s, the ratio on/off per pair and overall.

    .venv/bin/python bench/tracking_step.py [--model mlp] [--steps 1500] [-r 5] [--budget 600]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from budget import Budget  # noqa: E402
from train_overhead import hpcsuite_run, spread  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--shape", type=int, nargs="+", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("-r", "--repeats", type=int, default=5)
    Budget.add_argument(ap, 600, "repeats")
    a = ap.parse_args()
    a.backend, a.ranks, a.pin, a.mca, a.samples, a.user = "torch", 2, None, [], None, False
    a.shape = a.shape or ([3, 32, 32] if a.model == "resnet" else [32])
    budget = Budget.from_args(a)
    on, off = [], []
    with budget.watch(), tempfile.TemporaryDirectory() as work:
        for i in budget.each(range(a.repeats)):
            store = {"mlflow": {"uri": f"file:{work}/mlruns", "experiment": "bench"}}
            sides = [lambda: hpcsuite_run(a, Path(work)),
                     lambda: hpcsuite_run(a, Path(work), {"tracking": store})]
            first, second = (sides[i % 2](), sides[1 - i % 2]())
            mine = (first, second) if i % 2 == 0 else (second, first)
            off.append(mine[0])
            on.append(mine[1])
        logged = len(list(Path(work, "mlruns").glob("*/*/meta.yaml")))  # experiment/run
    budget.report(len(on), a.repeats, "repeats")
    print(f"MLflow runs written by the tracking side: {logged}")
    if not on:
        return 1
    o, f = statistics.median(r for r, _ in on), statistics.median(r for r, _ in off)
    print(f"torch {a.model} shape {a.shape}, batch {a.batch}/rank, 2 ranks, {a.steps} steps, "
          f"{len(on)} alternating repeats (medians, steady samples/s)")
    print(f"tracking off  {f:10.1f}   runs {', '.join(f'{r:.0f}' for r, _ in off)}")
    print(f"tracking on   {o:10.1f}   runs {', '.join(f'{r:.0f}' for r, _ in on)}")
    print(f"ratio on / off  {o / f:.3f}")
    print(f"ratio per pair  {spread([x[0] / y[0] for x, y in zip(on, off)])}")
    print(f"median step on / off  {statistics.median(s for _, s in on) / statistics.median(s for _, s in off):.3f}")
    return budget.exit_code()


if __name__ == "__main__":
    sys.exit(main())
