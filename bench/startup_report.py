"""The startup watch's report at N ranks: the file reads, directory listings and stats its ranks
make when none trains a step in time (issue 53, point 3: "the startup report read by one rank").

    .venv/bin/python bench/startup_report.py [--ranks 2,8,32,128] [--grace 5] [--silent 1]

N watches (threads of this process standing for N ranks, as tests/test_startup.py does) with a
bound of 0.2 s and the real grace, each reporting through a stand-in for `hpcsuite train`'s
fail(): the first writes the FAILED marker, as fail() does. With --silent K the last K ranks
never start (a rank hung where it cannot answer, the case the report is for: the others then
wait the whole grace for its word). Every `Path.read_text`,
`Path.glob` and `Path.exists`/`is_file` of the run directory is counted while they report.
Run it with another checkout's Python to count that product (before: `/work/before/.venv/bin/
python bench/startup_report.py`); the baseline is the same N in the other run. Fitted a + b·N +
c·N².
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import threading
import time
from collections import Counter

import numpy as np

import hpcsuite
from hpcsuite.runs.results import mark_failed
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.rank import startup

COUNTS: Counter = Counter()
ROOT: list[str] = []


def counted(name: str, original):
    def wrapper(self, *args, **kwargs):
        if ROOT and str(self).startswith(ROOT[0]):
            COUNTS[name] += 1
        return original(self, *args, **kwargs)
    return wrapper


for _name, _kind in (("read_text", "reads"), ("glob", "listings"), ("exists", "stats"),
                     ("is_file", "stats")):
    setattr(pathlib.Path, _name, counted(_kind, getattr(pathlib.Path, _name)))


def run(n: int, grace: float, silent: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"hpcsuite-startup-{n}-") as d:
        run_dir = pathlib.Path(d)
        marker = RunDir(run_dir).failed(0)
        said, done = [], threading.Event()

        def fail(rank: int):
            def on_stall(text: str) -> None:
                mark_failed(marker, rank, 1, text)
                said.append(rank)
                if len(said) == 1:
                    done.set()
            return on_stall

        watches = [startup.StartupWatch(0.2, run_dir, r, n, 0, fail(r), grace=grace)
                   for r in range(n)]
        COUNTS.clear()
        ROOT[:] = [d]
        t0 = time.monotonic()
        for w in watches[:n - silent]:
            w.mark(startup.BEFORE_STEP)
            w.start()
        time.sleep(0.2 + 4 * grace)        # past every rank's wait
        ROOT.clear()
        first = done.wait(0) and time.monotonic() - t0
        for w in watches:
            w.stop()
        return {"n": n, **{k: COUNTS[k] for k in ("reads", "listings", "stats")},
                "reported_by": len(set(said)), "first_report_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,8,32,128")
    ap.add_argument("--grace", type=float, default=startup.GRACE)
    ap.add_argument("--silent", type=int, default=0, help="ranks that never start")
    args = ap.parse_args()
    print(f"hpcsuite from {pathlib.Path(hpcsuite.__file__).parent}; grace {args.grace:g} s; "
          f"{args.silent} silent rank(s)")
    rows = [run(int(n), args.grace, args.silent) for n in args.ranks.split(",")]
    print(f"{'N':>5} {'reads':>8} {'listings':>9} {'stats':>8} {'ranks that reported':>20}")
    for r in rows:
        print(f"{r['n']:>5} {r['reads']:>8} {r['listings']:>9} {r['stats']:>8} "
              f"{r['reported_by']:>20}")
    ns = [r["n"] for r in rows]
    for key in ("reads", "listings", "stats"):
        if len(ns) >= 3:
            c, b, a = np.polyfit(ns, [r[key] for r in rows], 2)
            print(f"{key}: {a:.3g} + {b:.3g}·N + {c:.3g}·N²")


if __name__ == "__main__":
    sys.exit(main())
