"""The managed step before and after a change, in one run: bench/step_overhead.py of an earlier
commit and of this tree, alternated on the same machine.

Each side runs its own tree's bench/step_overhead.py with its own hpcsuite first on PYTHONPATH
(the earlier commit is unpacked with `git archive` into a temporary directory: the working tree
and its venv stay as they are). step_overhead.py times hpcsuite's managed loop against a plain
Horovod loop in the same process, so each process gives a managed step time and the ratio
plain/managed (the machine's speed mode cancels out of the ratio). The sides alternate,
ABBA..., for --pairs pairs; printed: each side's median managed step, its median plain/managed
ratio, and after/before of both (managed step after/before < 1: this tree faster; ratio
after/before > 1: this tree's loop costs less against the plain loop).

    .venv/bin/python bench/before_after.py --rev 1b01c1d [--pairs 4] [--rounds 12] [--budget S]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from budget import Budget

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"mean step managed ([\d.]+) ms, plain ([\d.]+) ms; plain/managed per round ([\d.]+)")


def unpack(rev: str) -> Path:
    where = Path(tempfile.mkdtemp(prefix=f"hpcsuite-{rev}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def one(tree: Path, a, seconds: float) -> tuple[float, float, float] | None:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    argv = ["mpirun", "--allow-run-as-root", "-np", "1", "--bind-to", "none", sys.executable,
            str(tree / "bench" / "step_overhead.py"), "--batch", str(a.batch),
            "--rounds", str(a.rounds), "--steps", str(a.steps), "--budget", str(int(seconds))]
    done = subprocess.run(argv, env=env, cwd=str(tree), capture_output=True, text=True,
                          timeout=seconds + 120)
    m = LINE.search(done.stdout)
    if not m:
        print(f"  {tree.name}: no result (exit {done.returncode}): "
              f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}", flush=True)
        return None
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="1b01c1d", help="the earlier commit (default 1b01c1d)")
    ap.add_argument("--pairs", type=int, default=4, help="before/after pairs (default 4)")
    ap.add_argument("--rounds", type=int, default=12, help="step_overhead rounds per process")
    ap.add_argument("--steps", type=int, default=128, help="steps per round")
    ap.add_argument("--batch", type=int, default=128)
    Budget.add_argument(ap, 1200, "pairs")
    a = ap.parse_args()
    budget = Budget.from_args(a)
    before = unpack(a.rev)
    sides = {f"before ({a.rev})": before, "after (this tree)": ROOT}
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in sides}
    per_process = max(60.0, budget.seconds / (2 * a.pairs) if budget.seconds else 120.0)
    with budget.watch(hard=False):
        for i in budget.each(range(a.pairs)):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for name in order:
                r = one(sides[name], a, per_process)
                if r:
                    got[name].append(r)
                    print(f"pair {i + 1} {name}: managed {r[0]:.3f} ms, plain {r[1]:.3f} ms, "
                          f"plain/managed {r[2]:.3f}", flush=True)
    budget.report(min(len(v) for v in got.values()), a.pairs, "pairs")
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[2] for x in v))
           for k, v in got.items() if v}
    for name, (managed, ratio) in med.items():
        print(f"{name}: {len(got[name])} processes, managed step median {managed:.3f} ms, "
              f"plain/managed median {ratio:.3f}")
    if len(med) == 2:
        (bm, br), (am, ar) = med.values()
        print(f"after/before: managed step {am / bm:.3f} (< 1: after faster), "
              f"plain/managed {ar / br:.3f} (> 1: after's loop costs less)")
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
