"""Count the outcomes of the hostile-input fuzzing (the checks of tests/fuzzing.py).

For each kind of input (job specs, site profiles, templates' inputs, command-line values) it
runs N fresh random cases through the real CLI and prints how many were accepted (and then
proved safe: the header sbatch reads holds exactly the job's options, bash runs the body
without side effects), refused (exit 2 naming file and key), and how many failed: tracebacks,
hangs, other exit codes, refusals that name no file or key, unsafe scripts.

    .venv/bin/python bench/fuzz_counts.py [-n 1000] [--seed S] [--budget SECONDS]

Unlike tests/test_fuzz.py (derandomised, the same cases each CI run) the cases here are new
every run unless --seed is given. When --budget runs out or a stop signal comes, the case in
flight finishes (a case has its own hang deadline), no more are run, and the counts so far are
printed.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from budget import Budget, Interrupted  # noqa: E402
from fuzzing import KINDS, Counts  # noqa: E402


def count(kind: str, n: int, rng_seed: int, budget: Budget) -> tuple[Counts, float]:
    strategy, run = KINDS[kind]
    counts = Counts()
    work = Path(tempfile.mkdtemp(prefix="hpcsuite-fuzz-"))

    @seed(rng_seed)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def one(case):
        if budget.expired():
            raise Interrupted()     # a BaseException: Hypothesis stops at once, no shrinking
        outcome, detail = run(case, work)
        counts.add(outcome, f"{detail}\ncase: {case!r}")

    t0 = time.monotonic()
    with contextlib.suppress(Interrupted):
        one()
    return counts, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="cases per kind")
    ap.add_argument("--seed", type=int, default=None)
    Budget.add_argument(ap, 900, "cases")
    args = ap.parse_args()
    budget = Budget.from_args(args)
    rng_seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {rng_seed}, {args.n} cases per kind")
    print(f"{'kind':22} {'cases':>6} {'accepted':>9} {'refused':>8} {'failures':>9} {'seconds':>8}")
    failed = False
    done = 0
    # SIGALRM is the cases' own hang deadline (tests/fuzzing.py): the budget is checked per case.
    with budget.watch(hard=False):
        for kind in budget.each(KINDS, predict=False):
            counts, seconds = count(kind, args.n, rng_seed, budget)
            done += counts.cases
            print(f"{kind:22} {counts.cases:6} {counts.accepted:9} {counts.refused:8} "
                  f"{len(counts.failures):9} {seconds:8.1f}", flush=True)
            for outcome, detail in counts.failures[:3]:
                failed = True
                print(f"  {outcome}: {detail[:600]}")
    budget.report(done, args.n * len(KINDS), "cases")
    sys.exit(budget.exit_code(1 if failed else 0))


if __name__ == "__main__":
    main()
