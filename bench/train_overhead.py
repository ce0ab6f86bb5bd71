"""`hpcsuite train` against a plain Horovod loop of the same model, batch and ranks
(quality bar: at most 2 % lower throughput).

Both run under the same `mpirun -np 2 --bind-to none` on this machine (--ranks N; with --pin
CPUS under `taskset -c CPUS`), alternating, R times;
the number compared is steady-state samples/s (the first tenth of steps, at most 10, left
out on both sides). hpcsuite reads a synthetic dataset through the sharding layer (a gather
per batch) while the plain loop reuses one fixed batch, as Horovod's synthetic benchmarks do.
    .venv/bin/python bench/train_overhead.py [--backend torch] [--model mlp] [-r 3] [--user]
        [--budget SECONDS]

--user: the model is a user's builder (bench/user_code/model.py, loaded by FILE.py:function
on both sides: --model mlp or cnn) and hpcsuite reads a user's python-factory dataset
(bench/user_code/data.py) through its sharding layer: the managed loop with your model and
your data.

--fresh-data: the plain loop reads a new batch every step (gathered by sample ids from random
arrays in memory, inside the timed step) instead of reusing one: not the baseline, but what a
plain loop pays for reading data, which hpcsuite pays too.

--host-costs: no MPI and no comparison; one process times, per call, the host-side pieces a
small step is made of (the framework's call into a step, converting and gathering a batch),
with the --backend, --shape and --batch given: what separates a managed step from a plain
one before Horovod's cycle (HOROVOD_CYCLE_TIME, 1 ms here) rounds both up.

--budget bounds the whole run: no repeat (or host piece) is started that would not fit, and a
stop signal or the budget's end stops the mpirun in flight; the completed repeats are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from budget import Budget, run_group

ROOT = Path(__file__).resolve().parent.parent


def mpirun(a) -> list[str]:
    """The launch both sides run under: --ranks ranks, with --pin under taskset."""
    pin = ["taskset", "-c", a.pin] if a.pin else []
    return [*pin, "mpirun", "-np", str(a.ranks), "--bind-to", "none", "--mca", "pml", "ob1",
            "--mca", "btl", "^openib", *a.mca]


# --yield: MPI ranks give the core up while they wait for a message. OpenMPI does so by itself
# when it knows a node is oversubscribed; two ranks with Horovod's background threads on this
# 2-core machine are, without OpenMPI knowing. Without it a run may fall into a mode where a
# waiting rank spins on the core the other rank computes on (single runs 5k-50k samples/s).
YIELD = ["--mca", "mpi_yield_when_idle", "1"]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
             HOROVOD_FUSION_THRESHOLD=str(64 << 20), HOROVOD_CYCLE_TIME="1")
    if os.geteuid() == 0:   # mpirun refuses root unless told; no other account is told
        e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return e


USER = ROOT / "bench" / "user_code"


def user_model(a) -> str:
    name = "build_cnn" if a.model == "cnn" else "build"
    return f"{USER / 'model.py'}:{name if a.backend == 'torch' else name + '_keras'}"


def hpcsuite_run(a, work: Path, train: dict | None = None) -> tuple[float, float]:
    """One `hpcsuite train` of the job; ``train``: more train keys (bench/tracking_step.py)."""
    samples = a.samples or a.batch * 2 * a.steps
    data = {"samples": samples, "shape": a.shape, "classes": 10, "workers": 0}
    model = a.model
    if a.user:
        model = user_model(a)
        data = {"kind": "python", "factory": f"{USER / 'data.py'}:random_data",
                "args": {"samples": samples, "shape": a.shape, "classes": 10}}
    job = {"name": "overhead", "train": {"backend": a.backend, "model": model, "data": data,
           "batch_size": a.batch, "epochs": 1, "lr": 0.01}}
    if a.samples:        # a dataset smaller than the run: epoch after epoch, up to --steps
        job["train"].update(epochs=10 ** 6, max_steps=a.steps)
    job["train"].update(train or {})
    run = Path(tempfile.mkdtemp(dir=work))
    (run / "job.json").write_text(json.dumps(job))
    run_group([*mpirun(a), "-x", "HPCSUITE_RUN_DIR", sys.executable, "-m", "hpcsuite", "train",
               "--job", str(run / "job.json")], check=True, capture_output=True,
              env=dict(env(), HPCSUITE_RUN_DIR=str(run)), cwd=run)
    r = json.loads((run / "results.json").read_text())
    return r["samples_per_s_steady"], r["step_time_s"]["median"]


def plain_run(a) -> tuple[float, float]:
    ref = ["--model-ref", user_model(a)] if a.user else []
    ref += ["--fresh-data"] if a.fresh_data else []
    ref += ["--samples", str(a.samples)] if a.fresh_data and a.samples else []
    out = run_group([*mpirun(a), sys.executable, str(ROOT / "bench" / "plain_loop.py"),
                     "--backend", a.backend, "--model", a.model, "--shape", *map(str, a.shape),
                     "--batch", str(a.batch), "--steps", str(a.steps), *ref],
                    check=True, capture_output=True, text=True, env=env())
    r = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    return r["samples_per_s_steady"], r["step_median_s"]


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):8.3f}  min {min(values):8.3f}  "
            f"max {max(values):8.3f}")


def timed(fn, calls: int = 2000, repeats: int = 7) -> float:
    """Median over repeats of the microseconds per call of ``fn``."""
    import time

    for _ in range(200):
        fn()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_call)


def host_pieces(a) -> dict:
    """The host-side pieces of a step, by name: functions to time per call."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from models import build
    from plain_loop import fresh_batches

    # The plain loop's --fresh-data reader over the dataset hpcsuite_run trains on.
    read = fresh_batches(argparse.Namespace(samples=None, batch=a.batch, steps=a.steps,
                                            shape=a.shape, classes=10), 0)
    order = iter(range(1 << 62))
    gather = lambda: read(next(order) % a.steps)  # noqa: E731
    pieces = {"gather a batch by sample id (numpy)": gather}
    if a.backend == "torch":
        import torch

        torch.set_num_threads(1)
        model = build(a.model, "torch", tuple(a.shape), 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        x, y = torch.randn(a.batch, *a.shape), torch.randint(0, 10, (a.batch,))

        def step(x, y):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

        def fresh():
            bx, by = gather()
            step(torch.from_numpy(bx), torch.from_numpy(by))

        pieces["step on one fixed batch (no Horovod)"] = lambda: step(x, y)
        pieces["step on a fresh batch, gather included"] = fresh
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
        import keras
        from hpcsuite.runtime.frameworks.tf_backend import graph_caller

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        model = build(a.model, "tensorflow", tuple(a.shape), 10)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        opt.build(model.trainable_variables)
        x, y = tf.random.normal((a.batch, *a.shape)), tf.zeros((a.batch,), tf.int64)
        w, scale = tf.ones((a.batch,)), tf.constant(0.5)

        def body(x, y, w, scale):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                per_sample = keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)
                loss = tf.reduce_sum(per_sample * w) * scale
            grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        fixed = tf.function(lambda: body(x, y, w, scale))
        step = tf.function(body, reduce_retracing=True)
        specs = [tf.TensorSpec([None, *a.shape]), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None]), tf.TensorSpec([])]
        concrete = step.get_concrete_function(*specs)
        direct = graph_caller(concrete)
        bx, by = gather()
        pieces["step, tf.function called with no arguments (plain loop)"] = fixed
        pieces["step, tf.function called with x, y, w, scale"] = lambda: step(x, y, w, scale)
        pieces["step, its ConcreteFunction called"] = lambda: concrete(x, y, w, scale)
        pieces["step, hpcsuite's graph_caller"] = lambda: direct(x, y, w, scale)
        pieces["tf.constant of the batch's inputs"] = lambda: tf.constant(bx)
        pieces["tf.constant of the batch's labels"] = lambda: tf.constant(by)
    return pieces


def host_costs(a, budget: Budget) -> None:
    pieces, costs = {}, {}
    with budget.watch():
        pieces = host_pieces(a)
        for what, fn in budget.each(pieces.items()):
            costs[what] = timed(fn)
    budget.report(len(costs), len(pieces) or None, "pieces")
    print(f"{a.backend} {a.model} shape {a.shape}, batch {a.batch}, one process, one thread "
          "(median of 7 x 2000 calls, us per call)")
    for what, us in costs.items():
        print(f"  {us:9.1f}  {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], default="torch")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--shape", type=int, nargs="+", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2, help="MPI ranks on each side (default 2)")
    ap.add_argument("--pin", metavar="CPUS", default=None,
                    help="run both sides under `taskset -c CPUS` (e.g. 0: one rank, one core)")
    ap.add_argument("--samples", type=int, default=None,
                    help="samples in hpcsuite's dataset and, with --fresh-data, the plain loop's "
                         "(default: 2 x batch x steps, one epoch); fewer: epochs repeat")
    ap.add_argument("--user", action="store_true",
                    help="a user's model builder and python-factory dataset (bench/user_code)")
    ap.add_argument("--fresh-data", action="store_true",
                    help="the plain loop gathers a new batch each step (not the baseline)")
    ap.add_argument("--host-costs", action="store_true",
                    help="time the host-side pieces of a step in one process (no MPI)")
    ap.add_argument("--yield", dest="yield_", action="store_true",
                    help="both sides under `--mca mpi_yield_when_idle 1` (see YIELD)")
    Budget.add_argument(ap, 900, "repeats (with --host-costs: pieces)")
    a = ap.parse_args()
    a.mca = YIELD if a.yield_ else []
    if a.ranks < 1 or (a.samples is not None and a.samples < 1):
        ap.error("--ranks and --samples: at least 1")
    if a.model == "cnn" and not a.user:
        ap.error("--model cnn is the user's CNN: use it with --user")
    a.shape = a.shape or ([3, 32, 32] if a.model in ("resnet", "cnn") else [32])
    budget = Budget.from_args(a)
    if a.host_costs:
        host_costs(a, budget)
        sys.exit(budget.exit_code())
    plain, ours = [], []
    with budget.watch(), tempfile.TemporaryDirectory() as work:
        for i in budget.each(range(a.repeats)):
            # Alternate which side goes first, so neither always follows the other's teardown.
            if i % 2:
                mine = hpcsuite_run(a, Path(work))
                theirs = plain_run(a)
            else:
                theirs = plain_run(a)
                mine = hpcsuite_run(a, Path(work))
            ours.append(mine)           # a repeat counts once both sides ran
            plain.append(theirs)
    budget.report(len(ours), a.repeats, "repeats")
    p, o = statistics.median(r for r, _ in plain), statistics.median(r for r, _ in ours)
    what = f"user model + python-factory data ({USER.relative_to(ROOT)})" if a.user else a.model
    print(f"{a.backend} {what} shape {a.shape}, batch {a.batch}/rank, {a.ranks} ranks"
          f"{f' on cpus {a.pin}' if a.pin else ''}, {a.steps} steps, "
          f"{len(ours)} alternating repeats (medians, samples/s)")
    if a.yield_:
        print("both sides: mpirun --mca mpi_yield_when_idle 1 (--yield)")
    if a.fresh_data:
        print("the plain loop gathers a new batch from memory every step (--fresh-data)")
    print(f"plain Horovod loop  {p:10.1f}   runs {', '.join(f'{r:.0f}' for r, _ in plain)}")
    print(f"hpcsuite train      {o:10.1f}   runs {', '.join(f'{r:.0f}' for r, _ in ours)}")
    print(f"ratio hpcsuite / plain  {o / p:.3f}  (overhead {100 * (1 - o / p):+.1f} %)")
    # Each pair ran back to back, so its ratio shares the machine's state of that moment.
    pairs = [mine[0] / theirs[0] for mine, theirs in zip(ours, plain)]
    print(f"ratio per alternating pair      {spread(pairs)}")
    # Runs on this 2-core machine sometimes fall into a slow mode (ranks and Horovod's threads
    # fighting for the cores) on either side; the ratio of each side's best runs shows what the
    # code costs when neither is disturbed.
    best = statistics.median(sorted(r for r, _ in ours)[-3:]) / \
        statistics.median(sorted(r for r, _ in plain)[-3:])
    print(f"ratio of the best three runs each  {best:.3f}")
    # The median step is blind to bursts of other work on the machine, which the mean (the
    # samples/s above) is not: plain median step / hpcsuite median step, per pair.
    steps = [theirs[1] / mine[1] for mine, theirs in zip(ours, plain)]
    print(f"median-step ratio per pair      {spread(steps)}")
    print(f"median step ms: plain {spread([1e3 * t for _, t in plain])}")
    print(f"                hpcsuite {spread([1e3 * t for _, t in ours])}")
    sys.exit(budget.exit_code())


if __name__ == "__main__":
    main()
