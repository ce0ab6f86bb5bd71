"""What train.tracking (MLflow) costs the training thread, in one process (no MPI, no framework).

A point is what the session's chart call costs rank 0's training thread: a chart's training() with 2
values (loss, lr; samples/s computed), for MLflow's Tracker (queued; its own thread sends
log_batch to a file store every FLUSH_SECONDS, running meanwhile) and for TensorBoard's chart
(an event written), in rounds alternated in the same process. Points come at most every
CHART_SECONDS (0.2 s), never per step.

    .venv/bin/python bench/tracking_overhead.py [--points 2000] [--rounds 3]
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


def median_point_us(chart, n: int) -> float:
    step_times, real, took = [0.01] * n, [64] * n, []
    for step in range(1, n + 1):
        t0 = time.perf_counter()
        chart.training(step, 0, {"loss": 1.0 / step, "learning_rate": 0.1}, step_times, real)
        took.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(took)


def main() -> None:
    from hpcsuite.runtime.observe.tensorboard import TensorBoard
    from hpcsuite.runtime.observe.tracking import Tracker
    from hpcsuite.submit.spec import spec_from_dict

    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    job = spec_from_dict({"name": "b", "train": {"tracking": {"mlflow": {}}}}, "bench")
    root = Path(tempfile.mkdtemp(prefix="tracking-bench-")) / "runs" / "b"
    for r in range(args.rounds):
        run_dir = root / str(r)
        run_dir.mkdir(parents=True)
        tracker = Tracker(job, run_dir, "bench").start()
        while not (run_dir / "mlflow.json").exists() and not tracker.broken:
            time.sleep(0.1)          # the run is open: its thread sends while we add
        mlflow_us = median_point_us(tracker, args.points)
        t0 = time.perf_counter()
        tracker.finish(None, "completed")
        finish_s = time.perf_counter() - t0
        board = TensorBoard(run_dir, "bench")
        board_us = median_point_us(board, args.points)
        board.close()
        print(f"round {r}: MLflow point {mlflow_us:.1f} us, TensorBoard point {board_us:.1f} us "
              f"(median of {args.points}); finish (last log_batch, run ended) {finish_s:.2f} s")


if __name__ == "__main__":
    main()
