"""What train.monitor.tensorboard costs a step, in one process (no MPI, no framework).

  point       one TensorBoard point of 3 scalars (Event + Summary protos, TensorBoard's
              RecordWriter with its checksums, a buffered write): what rank 0 pays per point,
              back to back and after 0.2 s of other work (cold caches, as in training)
  run.log()   script mode's per-step call (hpcsuite.api.Run.log with 2 values), with
              train.monitor.tensorboard off and on: on, it adds a point at most every
              CHART_SECONDS, so the difference is the per-step cost of charting
The managed loop adds a point only when it reads the ranks' vote (about every 0.25 s), never
per step: its per-step cost is zero, its per-second cost a few points.

    .venv/bin/python bench/tensorboard_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_point(n: int, between: float) -> float:
    """Median seconds to add a point, with ``between`` seconds of other work before each:
    back to back (0) the code is hot in the caches; in a training loop it is not."""
    from hpcsuite.runtime.observe.tensorboard import EventLog

    events = EventLog(Path(tempfile.mkdtemp(prefix="tb-bench-")), 0, "bench")
    took = []
    for step in range(n):
        end = time.perf_counter() + between
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        events.scalars(step, {"loss": 0.5, "learning_rate": 0.1, "throughput/samples_per_s": 1e4})
        took.append(time.perf_counter() - t0)
    events.close()
    return statistics.median(took)


def per_log_call(n: int, tensorboard: bool, step_seconds: float) -> float:
    """Mean seconds of Run.log() over ``n`` steps that each also spin ``step_seconds``."""
    from hpcsuite import api
    from hpcsuite.submit.spec import spec_from_dict

    job = spec_from_dict({"name": "b", "train": {"script": "t.py", "batch_size": 4,
                                                 "epochs": 10 ** 6, "max_steps": n,
                                                 "monitor": {"tensorboard": tensorboard}}}, "bench")
    run_dir = Path(tempfile.mkdtemp(prefix="tb-bench-"))
    run = api.Run(None, job=job, run_dir=run_dir)
    spent = 0.0
    for _ in run.batches(10 ** 6):
        end = time.perf_counter() + step_seconds     # the step's own work
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        run.log(loss=0.5, accuracy=0.9)
        spent += time.perf_counter() - t0
    run.session.close_chart()
    return spent / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--step-ms", type=float, default=1.0, help="each step's own work (default 1 ms)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    from hpcsuite.runtime.observe.chart import CHART_SECONDS

    hot, cold = per_point(a.points, 0.0), per_point(50, CHART_SECONDS)
    print(f"one point (3 scalars): {hot * 1e6:.1f} us back to back, {cold * 1e6:.1f} us after "
          f"{CHART_SECONDS:g} s of other work; at most one training point per {CHART_SECONDS:g} s: "
          f"<= {100 * cold / CHART_SECONDS:.3f} % of the time")
    off, on = [], []
    for _ in range(a.repeats):                    # alternated: both see the same machine
        off.append(per_log_call(a.steps, False, a.step_ms / 1000))
        on.append(per_log_call(a.steps, True, a.step_ms / 1000))
    off_us, on_us = statistics.median(off) * 1e6, statistics.median(on) * 1e6
    print(f"run.log() per step, {a.step_ms:g} ms steps: off {off_us:.2f} us, on {on_us:.2f} us "
          f"(+{on_us - off_us:.2f} us, {100 * (on_us - off_us) / (a.step_ms * 1000):.3f} % of a step)")


if __name__ == "__main__":
    main()
