"""The managed loop's per-step cost against a plain Horovod loop, in the same processes.

Separate jobs on this machine land in different speed modes (single 2-node jobs vary 2-5x), so
a few percent between two jobs cannot be told from the mode they drew. Here every rank builds
one model and one DistributedOptimizer and alternates, in rounds of R steps, between
  managed   hpcsuite's Trainer.train_epoch (the sharding layer, block reads, micro_step, the
            loop's bookkeeping and votes), as `hpcsuite train` runs it
  plain     the plain loop of bench/plain_loop.py --fresh-data: each step's batch gathered by
            sorted sample ids from the same in-memory dataset, whole fresh permutations per
            epoch (the same memory traffic), then zero_grad, forward, backward, step
so both see the same machine state. Printed on rank 0: each kind's mean step time (the median
over rounds) and the ratio plain/managed per round, median [quartiles] (> 1: hpcsuite faster).

--only managed|plain runs one of the two loops, on the same setup (model, optimizer and data
built by hpcsuite's backend), and prints its mean step: processes of each, alternated with
bench/plain_loop.py, tell whether a difference between separate processes comes from the setup
or from the loop.

    OMP_NUM_THREADS=1 mpirun -np 1 .venv/bin/python bench/step_overhead.py --batch 128
    # two ranks on two nodes of the local cluster (the weak-scaling setting), with the
    # environment hpcsuite's scripts give one-core ranks:
    eval "$(.venv/bin/python -m hpcsuite cluster env)"
    sbatch -N 2 --ntasks-per-node 1 -o /tmp/overhead-%j.out --wrap "export OMP_NUM_THREADS=1 \
      OMPI_MCA_mpi_yield_when_idle=1; mpirun -np 2 -npernode 1 --bind-to none \
      -x OMP_NUM_THREADS -x OMPI_MCA_mpi_yield_when_idle .venv/bin/python bench/step_overhead.py"

--reads runs no managed loop: it times what the array a batch is read into costs, by the plain
step with three reads (see --help). `two` is how the managed loop reads a block of one micro-batch
(it reads the next block early, while this step's is still in use); `one` is what reading it at the
step's start, once the loop let go of the last, would give (tried in 139db7a, reverted: no gain).
Since e3e0011 the managed loop reads micro-batches of 64 KiB up to 32 MiB as `plain` does, so
`two` is its read only for bigger ones (and for blocks of smaller ones).

--budget bounds the run: the ranks agree at each round boundary (a Horovod vote) whether to
start another, so a stop signal (mpirun passes SIGTERM and SIGINT on to the ranks) or the end of
the budget on any rank stops them all after the round in flight; rank 0 prints the completed
rounds.
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

from budget import Budget  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128, help="per-rank batch (default 128)")
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--shape", type=int, default=784)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=128, help="steps per round (the first 10 not counted)")
    ap.add_argument("--only", choices=["managed", "plain"],
                    help="run this loop alone and print its mean step (default: both, alternated)")
    ap.add_argument("--reads", action="store_true",
                    help="no managed loop: the plain step with its batch read three ways, rounds "
                         "alternated: plain (x[ids] into new arrays), one (hpcsuite's block read "
                         "into an array used again, the last step's tensors let go first) and two "
                         "(the same while the last step's are still held: two arrays take turns)")
    ap.add_argument("--no-votes", action="store_true",
                    help="the managed loop posts no votes (what its votes cost: alternate runs "
                         "with and without)")
    Budget.add_argument(ap, 600, "rounds")
    a = ap.parse_args()
    if a.only and a.reads:
        ap.error("--only and --reads: give one of them")
    budget = Budget.from_args(a)

    import numpy as np
    import torch

    from hpcsuite.runtime.input.data import open_data
    from hpcsuite.runtime.session.loop import Policy, Progress, Trainer
    from hpcsuite.runtime.input.sharding import Cursor, Sharder
    from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
    from hpcsuite.submit.spec import spec_from_dict

    job = spec_from_dict({
        "name": "overhead", "resources": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1},
        "train": {"backend": "torch", "model": "mlp", "batch_size": a.batch, "lr": 0.05,
                  "epochs": 10 ** 6, "max_steps": 10 ** 9,
                  "data": {"kind": "synthetic", "samples": a.samples, "shape": [a.shape],
                           "classes": 10}}}, "bench")
    backend = TorchBackend(job)
    data = open_data(job.train.data, job.train.seed)
    backend.build(data)
    trainer = Trainer(job, Path(tempfile.mkdtemp(prefix="overhead-")), backend)
    trainer.poll, trainer.poll_step = None, 0
    if a.no_votes:
        trainer.session.vote_due = lambda tick: False
    progress, policy = Progress(), Policy(job, 0, time.monotonic())
    sharder = Sharder(len(data), backend.size, backend.rank, a.batch, job.train.seed)

    def managed(n: int) -> list[float]:
        start = len(trainer.metrics.step_times)
        while len(trainer.metrics.step_times) - start < n:
            trainer.train_epoch(data, sharder, progress, policy)
            if progress.cursor.consumed >= len(data):
                progress.cursor = Cursor(progress.cursor.epoch + 1, 0)
        return trainer.metrics.step_times[start:start + n]

    rng = np.random.default_rng(backend.rank)
    batches = [np.sort(c) for _ in range(4)
               for c in rng.permutation(len(data))[:len(data) // a.batch * a.batch].reshape(-1, a.batch)]
    loss_fn, model, opt = torch.nn.CrossEntropyLoss(), backend.model, backend.optimizer
    at = 0

    def plain_steps(read, let_go: bool = False):
        """Rounds of the plain step (zero_grad, forward, backward, step) on ``read(i)``'s batch
        (x, y); ``let_go``: drop the step's tensors before the next read."""
        def run(n: int) -> list[float]:
            nonlocal at
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                x, y = read(at)
                at += 1
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                if let_go:
                    del x, y
                times.append(time.perf_counter() - t0)
            return times
        return run

    def gather(i: int):
        ids = batches[i % len(batches)]
        return torch.from_numpy(data.x[ids]), torch.from_numpy(data.y[ids])

    plain = plain_steps(gather)

    from hpcsuite.runtime.input.blocks import Buffers, read_block

    buffers, held = Buffers(), []

    def into_buffers(hold: bool):
        """The plain step, its batch read as hpcsuite reads a block (read_block into arrays used
        again); ``hold``: the last step's tensors are still referenced while the next is read
        (two arrays take turns), else they are let go first (one array)."""
        def read(i: int):
            block = read_block(data, [sharder_batches[i % len(sharder_batches)]], buffers)
            x, y = (torch.from_numpy(f).unbind(0)[0] for f in (block.x, block.y))
            held[:] = [x, y] if hold else []
            return x, y
        return plain_steps(read, let_go=True)

    sharder_batches = [b for e in range(4) for b in sharder.epoch(Cursor(e, 0))]
    if a.reads:
        kinds = {"plain": plain, "one": into_buffers(False), "two": into_buffers(True)}
    else:
        kinds = {"managed": managed, "plain": plain}
    means: dict[str, list[float]] = {k: [] for k in kinds}
    ratios = []
    # Every rank must run the same rounds (each step is an allreduce): the stop is voted.
    # A vote the managed loop posted may still be in flight (same tensor name): collect it first.
    def agree(stop: bool) -> bool:
        trainer.session.settle_vote()
        return bool(backend.vote_result(backend.vote_start([int(stop)]))[0])

    with budget.watch(hard=False):
        for r in budget.each(range(a.rounds), agree=agree):
            got = {}
            order = tuple(kinds) if r % 2 else tuple(kinds)[::-1]
            for kind in (a.only,) if a.only else order:
                got[kind] = statistics.mean(kinds[kind](a.steps)[10:])
            for kind, mean in got.items():
                means[kind].append(mean)
            if len(got) == 2:
                ratios.append(got["plain"] / got["managed"])
    if backend.rank == 0:
        budget.report(len(means[a.only or "plain"]), a.rounds, "rounds")
        if a.only:
            print(f"ranks {backend.size}, batch {a.batch} per rank, {len(means[a.only])} rounds of {a.steps} "
                  f"steps: mean step {a.only} alone {statistics.median(means[a.only]) * 1e3:.3f} ms",
                  flush=True)
            sys.exit(budget.exit_code())
        if a.reads:
            print(f"ranks {backend.size}, batch {a.batch} per rank, {len(means['one'])} rounds of "
                  f"{a.steps} steps, mean step: " + ", ".join(
                      f"{k} {statistics.median(v) * 1e3:.3f} ms" for k, v in means.items()))
            for num, den in (("one", "two"), ("plain", "one")):
                per = [n / d for n, d in zip(means[num], means[den])]
                q = statistics.quantiles(per, n=4) if len(per) > 1 else per * 3
                print(f"  step {num}/{den} per round {statistics.median(per):.3f} "
                      f"[{q[0]:.3f}-{q[2]:.3f}] (< 1: {num} faster)", flush=True)
            sys.exit(budget.exit_code())
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"ranks {backend.size}, batch {a.batch} per rank, {len(ratios)} rounds of {a.steps} steps: "
              f"mean step managed {statistics.median(means['managed']) * 1e3:.3f} ms, "
              f"plain {statistics.median(means['plain']) * 1e3:.3f} ms; plain/managed per round "
              f"{statistics.median(ratios):.3f} [{q[0]:.3f}-{q[2]:.3f}]", flush=True)
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
