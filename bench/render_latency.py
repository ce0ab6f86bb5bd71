"""Login-node latency: `hpcsuite render` against the floor of importing click + jinja2 + yaml.

Runs each command N times in fresh interpreters, alternating, and prints medians and the ratio,
of wall time and of CPU time (the child's user + system time: on a busy 2-core machine the wall
time of a 100 ms start-up swings with whatever else runs, its CPU time much less).
    .venv/bin/python bench/render_latency.py [-n 30] [--rev COMMIT] [--budget SECONDS]

--rev COMMIT also runs that commit's `hpcsuite render` (unpacked with `git archive`, its
hpcsuite first on PYTHONPATH, byte-compiled alike) in the same rounds: before and after a change.

hpcsuite is byte-compiled first, as a wheel install (and scripts/setup.sh) does: under
PYTHONDONTWRITEBYTECODE=1 an editable install would otherwise recompile every module on every
run, while click, jinja2 and yaml on the floor side were compiled when pip installed them.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from budget import Budget, run_group

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "sbatch" / "quickstart.yaml"
PROFILE = ROOT / "sbatch" / "profile.yaml"

CASES = {
    "floor: python -c 'import click, jinja2, yaml'": [sys.executable, "-c", "import click, jinja2, yaml"],
    "hpcsuite render": [sys.executable, "-m", "hpcsuite", "render", str(SPEC), "--profile", str(PROFILE)],
    "hpcsuite submit --dry-run": [sys.executable, "-m", "hpcsuite", "submit", str(SPEC), "--dry-run"],
    "hpcsuite --help": [sys.executable, "-m", "hpcsuite", "--help"],
}


def timed(argv: list[str], env: dict | None = None, cwd: Path = ROOT) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv`` in ``cwd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run_group(argv, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--rev", help="also time this commit's `hpcsuite render` in the same rounds")
    Budget.add_argument(ap, 300, "rounds")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    cases = {name: (argv, None, ROOT) for name, argv in CASES.items()}
    trees = [ROOT]
    if args.rev:
        import os
        import tempfile

        tree = Path(tempfile.mkdtemp(prefix=f"render-{args.rev}-"))
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        trees.append(tree)
        # run in the unpacked tree: `python -m` puts the working directory first on sys.path
        cases[f"hpcsuite render ({args.rev})"] = (CASES["hpcsuite render"],
                                                  {**os.environ, "PYTHONPATH": str(tree)}, tree)
    samples = {name: [] for name in cases}
    cpu = {name: [] for name in cases}
    with budget.watch():
        for tree in trees:
            run_group([sys.executable, "-m", "compileall", "-q", str(tree / "hpcsuite")],
                      check=True, stdout=subprocess.DEVNULL)
        for name, (argv, env, cwd) in cases.items():
            timed(argv, env, cwd)  # warm the page cache
        for _ in budget.each(range(args.n)):
            times = {name: timed(argv, env, cwd) for name, (argv, env, cwd) in cases.items()}
            for name, (t, c) in times.items():      # a round counts once every case ran
                samples[name].append(t)
                cpu[name].append(c)
    rounds = len(samples[next(iter(cases))])
    budget.report(rounds, args.n, "rounds")
    for title, table in (("wall time", samples), ("CPU time (user + system)", cpu)):
        show(title, table)
    sys.exit(budget.exit_code())


def show(title: str, samples: dict[str, list[float]]) -> None:
    names = list(samples)
    floor = statistics.median(samples[names[0]])
    print(f"\n{title}\n{'command':45} {'median ms':>10} {'p90 ms':>8} {'x floor':>8}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        p90 = sorted(xs)[int(0.9 * (len(xs) - 1))]
        print(f"{name:45} {med * 1e3:10.1f} {p90 * 1e3:8.1f} {med / floor:8.2f}")
    # The ratio of medians hides how noisy a shared machine is: the ratio within each round
    # (cases run back to back) shows its spread.
    for name in names[1:]:
        ratios = sorted(a / f for a, f in zip(samples[name], samples[names[0]]))
        print(f"{name:45} per-round ratio: median {statistics.median(ratios):.2f}, "
              f"p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[(9 * len(ratios)) // 10]:.2f}")


if __name__ == "__main__":
    main()
