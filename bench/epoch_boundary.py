"""What an epoch costs with loader workers: the managed loop with train.data.workers 1 against
workers 0, on short epochs, in one process pinned to one core (a one-core rank: the worker
shares the rank's core), rounds alternated.

Each round runs --epochs epochs of --steps steps with each setting (the order swapped every
round), one Trainer per setting over the same synthetic data (MLP 784-64-64-10 by default, as
bench/step_overhead.py), each epoch timed whole: its boundary (loader start or refill) and
its steps. Printed: the median epoch of each setting, the ratio workers/no-workers per round,
median [quartiles] (goal: <= 1.5), the first epoch with workers (the workers' start), and the
loader worker processes started in all, seen among this process's descendants by name (torch's
pt_data_worker, hpcsuite-loader) or as spawned processes, sampled every 50 ms (a worker lives
for the epoch at least).

Run it against another checkout (the code before a change) with PYTHONPATH:
    .venv/bin/python bench/epoch_boundary.py [--rounds 8] [--epochs 3] [--steps 64]
    PYTHONPATH=/tmp/before .venv/bin/python bench/epoch_boundary.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from budget import Budget  # noqa: E402


# A loader worker's process name: torch DataLoader's, hpcsuite's own (hpcsuite.runtime.input.workers);
# any spawned process counts too (multiprocessing's spawn_main).
LOADERS = ("pt_data_worker", "hpcsuite-loader")


def descendants(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                out += map(int, kids)
                todo += map(int, kids)
        except OSError:
            continue
    return out


class WorkerCount(threading.Thread):
    """Distinct loader worker processes seen below this process."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: set[int] = set()
        self.done = threading.Event()

    def run(self):
        me = os.getpid()
        while not self.done.wait(0.05):
            for pid in descendants(me):
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    spawned = b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if comm in LOADERS or spawned:
                    self.seen.add(pid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each setting per round")
    ap.add_argument("--steps", type=int, default=64, help="steps per epoch (default 64)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--shape", type=int, default=784)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], default="torch")
    ap.add_argument("--cpu", type=int, default=None,
                    help="the core to pin this process and its workers to (default: the last "
                         "one it may use)")
    Budget.add_argument(ap, 900, "rounds")
    a = ap.parse_args()
    budget = Budget.from_args(a)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {a.cpu if a.cpu is not None else cpus[-1]})
    os.environ["OMP_NUM_THREADS"] = "1"

    import hpcsuite
    from hpcsuite.runtime.input.data import open_train_eval
    from hpcsuite.runtime.session.loop import Policy, Progress, Trainer
    from hpcsuite.runtime.input.sharding import Cursor, Sharder
    from hpcsuite.runtime.frameworks.managed import make_backend
    from hpcsuite.submit.spec import spec_from_dict

    def setting(workers: int):
        job = spec_from_dict({
            "name": "epochs", "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1},
            "train": {"backend": a.backend, "model": "mlp", "batch_size": a.batch, "lr": 0.05,
                      "epochs": 10 ** 6, "max_steps": 10 ** 9,
                      "data": {"kind": "synthetic", "samples": a.steps * a.batch,
                               "shape": [a.shape], "classes": 10, "workers": workers}}}, "bench")
        backend = make_backend(job)
        data, _ = open_train_eval(job.train, job.train.seed)
        backend.build(data)
        trainer = Trainer(job, Path(tempfile.mkdtemp(prefix="epochs-")), backend)
        progress, policy = Progress(), Policy(job, 0, time.monotonic())
        sharder = Sharder(len(data), backend.size, backend.rank, a.batch, job.train.seed)

        def epoch() -> float:
            t0 = time.perf_counter()
            trainer.train_epoch(data, sharder, progress, policy)
            progress.cursor = Cursor(progress.cursor.epoch + 1, 0)
            return time.perf_counter() - t0
        return backend, epoch

    count = WorkerCount()
    count.start()
    kinds = {0: setting(0), a.workers: setting(a.workers)}
    times: dict[int, list[float]] = {k: [] for k in kinds}
    ratios, first = [], None
    with budget.watch(hard=False):
        for r in budget.each(range(a.rounds)):
            got = {}
            for k in (tuple(kinds) if r % 2 else tuple(kinds)[::-1]):
                got[k] = [kinds[k][1]() for _ in range(a.epochs)]
            if first is None:                # the workers' start: reported, not counted
                first = got[a.workers][0]
                continue
            for k, v in got.items():
                times[k] += v
            ratios.append(statistics.median(got[a.workers]) / statistics.median(got[0]))
    count.done.set()
    count.join()
    started = len(count.seen)
    for backend, _ in kinds.values():
        if getattr(backend, "_workers", None) is not None:
            backend._workers.close()
    budget.report(len(ratios), a.rounds - 1, "rounds")
    if ratios:
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        epochs = a.rounds * a.epochs if not budget.stopped_by else (len(ratios) + 1) * a.epochs
        print(f"{Path(hpcsuite.__file__).parent.parent}: one core, {a.steps}-step epochs of "
              f"batch {a.batch} x {a.shape}, {len(ratios)} rounds of {a.epochs} epochs each "
              f"(after one warm-up round): median epoch workers 0 "
              f"{statistics.median(times[0]) * 1e3:.1f} ms, workers {a.workers} "
              f"{statistics.median(times[a.workers]) * 1e3:.1f} ms; workers/none per round "
              f"{statistics.median(ratios):.2f} [{q[0]:.2f}-{q[2]:.2f}]; first epoch with "
              f"workers {first * 1e3:.0f} ms; worker processes started {started} over "
              f"{epochs} epochs with workers", flush=True)
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
