"""What naming slow ranks (issue O, point 1) costs a step: the managed loop with it and without.

One process, one rank (Horovod initialised in-process, no mpirun, as bench/gpu_pipeline.py
--device cpu runs), one model and one DistributedOptimizer built by hpcsuite's torch backend,
the built-in mlp (784-64-64-10) at small batches: 0.5-2 ms steps, where a fixed cost per step
weighs most. Three measurements:

1. The managed loop (Trainer.train_epoch, votes and all), rounds of --steps steps alternated
   (the order swapped every round, round 0 warm-up) between
     on   the product as it is: micro_step's timed TorchBackend.synchronize, then the step
          in optimizer.skip_synchronize(); each vote's Balance.at_vote and rank 0's
          Balance.read (its SlowRank, started as Trainer.run starts it)
     off  the same objects with, on the instances only, TorchBackend.synchronize a no-op and
          optimizer.skip_synchronize a contextlib.nullcontext (so optimizer.step()
          synchronises inside, as before the feature), Balance.at_vote returning (None, None)
          and Balance.read nothing
   A round's time is its wall clock over its steps. Printed: each side's median step, on/off
   per round, median [quartiles], and the spread of off/off between consecutive rounds (the
   noise floor: a difference inside it is not resolvable).
2. The host work the feature adds to each step, timed directly (timeit, repeats alternated):
   `backend.synchronize(); with opt.skip_synchronize(): opt.step()` (the product's path)
   against `opt.step()` (the path before), both with the optimizer's own synchronize stubbed
   to a no-op so that only the code around it differs (the allreduce's wait is the same on
   both sides); per call, the median of the repeats' means, and the difference as a share of
   the managed loop's median step.
3. The per-vote work: Balance.at_vote on one rank, and rank 0's SlowRank.add over a full window
   at 2 to 1,024 ranks (votes of 40 steps: a 5-vote window, and of 1 step: a 200-vote window,
   steps of 0.25 s or more), as a share of the ~0.25 s between votes (of a step, when a vote
   covers 1 step): rank 0 does it on the training thread.

    OMP_NUM_THREADS=1 .venv/bin/python bench/straggler_cost.py [--batch 32] [--budget 300]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from budget import Budget  # noqa: E402

def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return statistics.median(values), q[0], q[2]


def setup(a):
    """Backend, data, trainer (its SlowRank started), sharder and a policy that ends rounds."""
    from hpcsuite.submit.knobs import environment
    from hpcsuite.submit.spec import spec_from_dict

    job = spec_from_dict({
        "name": "straggler-cost", "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1},
        "train": {"backend": "torch", "model": "mlp", "batch_size": a.batch, "lr": 0.01,
                  "epochs": 10 ** 6, "max_steps": 10 ** 9,
                  "data": {"kind": "synthetic", "samples": a.samples, "shape": [a.shape],
                           "classes": 10}}}, "bench")
    # The HOROVOD_* variables `hpcsuite train`'s batch script gives its ranks.
    for name, value in environment(job.train.horovod, {}).items():
        os.environ.setdefault(name, value)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from hpcsuite.runtime.input.data import open_data
    from hpcsuite.runtime.session.loop import Policy, Trainer
    from hpcsuite.runtime.input.sharding import Sharder
    from hpcsuite.runtime.frameworks.torch_backend import TorchBackend

    backend = TorchBackend(job)
    data = open_data(job.train.data, job.train.seed)
    backend.build(data)
    trainer = Trainer(job, Path(tempfile.mkdtemp(prefix="straggler-cost-")), backend)
    trainer.balance.start([socket.gethostname()] * backend.size)

    class Rounds(Policy):
        """The job's policy, done after the round's last step."""
        target = 0

        def done(self, step: int) -> bool:
            return step >= self.target

    sharder = Sharder(len(data), backend.size, backend.rank, a.batch, job.train.seed)
    return backend, data, trainer, sharder, Rounds(job, 0, time.monotonic())


def switch(backend, balance, on: bool) -> None:
    """The feature on (the classes' methods) or off (instance attributes bypassing it)."""
    opt = backend.optimizer
    if on:
        for obj, name in ((backend, "synchronize"), (opt, "skip_synchronize"),
                          (balance, "at_vote"), (balance, "read")):
            obj.__dict__.pop(name, None)
        return
    backend.synchronize = lambda: None
    opt.skip_synchronize = contextlib.nullcontext      # opt.step() synchronises, as before
    balance.at_vote = lambda step_times: (None, None)
    balance.read = lambda own, wait: None


def loop_rounds(a, budget: Budget, backend, data, trainer, sharder, policy) -> dict:
    """Measurement 1: {"on": [...], "off": [...]} seconds per step, one entry per round."""
    from hpcsuite.runtime.session.loop import Progress
    from hpcsuite.runtime.input.sharding import Cursor

    progress = Progress()

    def managed(n: int) -> float:
        policy.target = progress.step + n
        t0 = time.perf_counter()
        while progress.step < policy.target:
            trainer.train_epoch(data, sharder, progress, policy)
            if progress.cursor.consumed >= len(data):
                progress.cursor = Cursor(progress.cursor.epoch + 1, 0)
        return (time.perf_counter() - t0) / n

    times: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for r in budget.each(range(a.rounds + 1)):
            for kind in (("on", "off") if r % 2 else ("off", "on")):
                switch(backend, trainer.balance, kind == "on")
                t = managed(a.steps)
                if r:                                  # round 0 is warm-up
                    times[kind].append(t)
    finally:
        switch(backend, trainer.balance, True)
        trainer.session.settle_vote()
    return times


def host_work(a, backend) -> dict:
    """Measurement 2: seconds per call of the product's step path and of the path before."""
    import torch

    model, opt = backend.model, backend.optimizer
    x = torch.randn(a.batch, a.shape)
    y = torch.randint(0, 10, (a.batch,))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()                  # the allreduce of these gradients is done: none pending
    opt.synchronize = lambda: None     # (instance) both paths below call it: same work
    try:
        def before():
            opt.step()

        def timed():
            backend.synchronize()
            with opt.skip_synchronize():
                opt.step()

        got: dict[str, list[float]] = {"before": [], "timed": []}
        for r in range(a.repeats):
            for name, fn in ((("before", before), ("timed", timed)) if r % 2
                             else (("timed", timed), ("before", before))):
                got[name].append(timeit.timeit(fn, number=a.calls) / a.calls)
    finally:
        del opt.synchronize
    backend.take_wait()
    return got


def vote_work(a) -> dict:
    """Measurement 3: seconds per Balance.at_vote (one rank) and per SlowRank.add at N ranks
    (over a full window; measured where one add takes under a second, else estimated as the
    window's votes times the rule's per-vote work, ``behind``, measured at N ranks)."""
    from hpcsuite.runs.stragglers import WINDOW_STEPS, Sample, SlowRank, behind
    from hpcsuite.runtime.session.balance import Balance

    class Waits:                       # a backend that timed some wait
        def take_wait(self):
            return 0.002

    balance = Balance(Waits(), 1)
    step_times = [0.001] * 200

    def at_vote():
        balance.mark = 0
        balance.at_vote(step_times)

    out = {"at_vote": timeit.timeit(at_vote, number=2000) / 2000, "watch": {}}
    rng = random.Random(0)
    for ranks in a.ranks:
        own = tuple(rng.uniform(0.9e-3, 1.1e-3) for _ in range(ranks))
        wait = tuple(rng.uniform(0.1e-3, 0.2e-3) for _ in range(ranks))
        n = max(1, min(1000, int(0.2 / max(1e-7, timeit.timeit(lambda: behind(own), number=1)))))
        per_vote = timeit.timeit(lambda: behind(own), number=n) / n
        for steps in (40, 1):
            window = -(-WINDOW_STEPS // steps)
            if per_vote * window > 1.0:
                out["watch"][(ranks, steps)] = (per_vote * window, "estimated")
                continue
            watch = SlowRank([f"node{r}" for r in range(ranks)])
            for _ in range(window + 5):                      # a full window first
                watch.samples.append(Sample(steps, own, wait))
            n = max(1, min(200, int(0.3 / (per_vote * window))))
            out["watch"][(ranks, steps)] = (
                timeit.timeit(lambda: watch.add(steps, own, wait), number=n) / n, "measured")
    return out


def report(a, times: dict, host: dict, votes: dict) -> None:
    from hpcsuite.runs.stragglers import WINDOW_STEPS
    from hpcsuite.runtime.session.policy import VOTE_SECONDS as vote_s

    on, off = times["on"], times["off"]
    rounds = len(on)
    ratio = quartiles([x / y for x, y in zip(on, off)])
    floor = quartiles([x / y for x, y in zip(off[1:], off[:-1])]) if rounds > 2 else (1, 1, 1)
    step = statistics.median(on)
    print(f"managed loop, mlp 784-64-64-10, batch {a.batch}, one rank on the CPU, {rounds} rounds "
          f"of {a.steps} steps: median step on {1e3 * step:.3f} ms, off "
          f"{1e3 * statistics.median(off):.3f} ms")
    print(f"  on/off per round {ratio[0]:.4f} [{ratio[1]:.4f}-{ratio[2]:.4f}]; off/off of "
          f"consecutive rounds {floor[0]:.4f} [{floor[1]:.4f}-{floor[2]:.4f}] (the noise floor)")
    b, t = (statistics.median(host[k]) for k in ("before", "timed"))
    added = t - b
    print(f"host work per step ({a.repeats} repeats of {a.calls} calls): opt.step() {1e6 * b:.2f} "
          f"us, timed synchronize + skip_synchronize + opt.step() {1e6 * t:.2f} us: "
          f"{1e6 * added:+.2f} us = {100 * added / step:+.3f} % of the {1e3 * step:.3f} ms step")
    per_vote = max(1, int(vote_s / step))
    print(f"per vote (every ~{vote_s} s: {per_vote} steps of {1e3 * step:.3f} ms): "
          f"Balance.at_vote {1e6 * votes['at_vote']:.1f} us = "
          f"{100 * votes['at_vote'] / per_vote / step:.4f} % of a step")
    for (ranks, steps), (sec, how) in votes["watch"].items():
        # a vote of 1 step: steps of vote_s or more, so the vote period is at least vote_s
        print(f"  rank 0's SlowRank.add at {ranks:5d} ranks, votes of {steps:2d} steps "
              f"({-(-WINDOW_STEPS // steps)}-vote window): {1e3 * sec:10.3f} ms ({how}) = "
              f"{100 * sec / vote_s:8.3f} % of the {vote_s} s between votes")
    width = (ratio[2] - ratio[1]) / 2
    print(f"resolution: the on/off quartiles span +-{100 * width:.2f} %; a 0.5 % difference is "
          f"{'resolvable' if width < 0.005 else 'NOT resolvable'} by the loop A/B on this machine; "
          f"the direct timing resolves the host work to ~0.1 us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32, help="batch (default 32: ~0.5-1 ms steps)")
    ap.add_argument("--shape", type=int, default=784)
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=120, help="loop rounds, after a warm-up one")
    ap.add_argument("--steps", type=int, default=400, help="steps per round and side")
    ap.add_argument("--repeats", type=int, default=20, help="timeit repeats per path")
    ap.add_argument("--calls", type=int, default=5000, help="calls per timeit repeat")
    ap.add_argument("--ranks", default="2,16,128,1024", help="rank counts for SlowRank.add")
    Budget.add_argument(ap, 300, "rounds")
    a = ap.parse_args()
    a.ranks = [int(r) for r in a.ranks.split(",") if r.strip()]
    if a.rounds < 2 or a.steps < 1 or a.batch < 1 or a.samples < a.batch or min(a.ranks) < 2:
        ap.error("--rounds at least 2, --steps and --batch at least 1, --samples at least "
                 "--batch, --ranks at least 2 each")
    budget = Budget.from_args(a)
    backend, data, trainer, sharder, policy = setup(a)
    host = host_work(a, backend)
    votes = vote_work(a)
    with budget.watch():
        times = loop_rounds(a, budget, backend, data, trainer, sharder, policy)
    budget.report(len(times["on"]), a.rounds, "rounds")
    if len(times["on"]) < 2:
        print("too few rounds to compare")
        sys.exit(budget.exit_code(1))
    report(a, times, host, votes)
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
