"""A plain Horovod synthetic-benchmark loop (the baseline for `hpcsuite train`), in the style
of Horovod's own pytorch/tensorflow2 synthetic benchmarks: one fixed random batch, the same
model from models/, SGD with momentum, DistributedOptimizer / DistributedGradientTape.

--fresh-data: not the baseline but a measure of what reading data costs: each step gathers a
new batch by sample ids (sorted, as hpcsuite's sharding layer hands them out) from random
arrays in memory of the size hpcsuite trains on, inside the timed step.

Run under mpirun by bench/train_overhead.py and bench/weak_scaling.py; prints one JSON line on
rank 0. A helper, not a benchmark: it takes no --budget; its parent stops it when the parent's
budget ends (train_overhead stops mpirun's process group, weak_scaling cancels the job).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time



def steady(times: list[float], per_step: int, window: int = 0) -> dict:
    skip = min(10, len(times) // 10)          # the same warm-up rule as hpcsuite's results
    r = {"samples_per_s_steady": per_step * len(times[skip:]) / sum(times[skip:]),
         "step_median_s": statistics.median(times)}
    if window:      # how the machine's speed moves within one process
        r["window_mean_step_s"] = [sum(times[i:i + window]) / len(times[i:i + window])
                                   for i in range(skip, len(times), window)]
    return r


def fresh_batches(a, rank: int):
    """A function giving step i's (inputs, labels) as numpy arrays, read from memory."""
    import numpy as np

    rows = a.samples or a.batch * 2 * a.steps
    rng = np.random.default_rng(rank)
    data_x = rng.standard_normal((rows, *a.shape), dtype=np.float32)
    data_y = rng.integers(0, a.classes, rows)
    # Epoch after epoch of fresh permutations, cut into steps (a dataset smaller than the run
    # is read more than once, as in training).
    epochs = -(-a.batch * a.steps // rows)
    order = np.concatenate([rng.permutation(rows) for _ in range(epochs)])
    ids = np.sort(order[:a.batch * a.steps].reshape(a.steps, a.batch), axis=1)
    return lambda i: (data_x[ids[i]], data_y[ids[i]])


def build_model(a, backend: str):
    """The built-in model, or with --model-ref the user's builder, loaded as hpcsuite does."""
    from hpcsuite import models, usercode

    ref = usercode.parse(a.model_ref) if a.model_ref else None
    if ref is None:
        return models.build(a.model, backend, tuple(a.shape), a.classes)
    return usercode.load(ref, usercode.search_dirs([]))(tuple(a.shape), a.classes)


def run_torch(a) -> dict | None:
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    model = build_model(a, "torch")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    x = torch.randn(a.batch, *a.shape)
    y = torch.randint(0, a.classes, (a.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    read = fresh_batches(a, hvd.rank()) if a.fresh_data else None
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        if read:
            x, y = map(torch.from_numpy, read(i))
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return steady(times, a.batch * hvd.size(), a.window) if hvd.rank() == 0 else None


def run_tensorflow(a) -> dict | None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import keras
    import horovod.tensorflow as hvd

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model = build_model(a, "tensorflow")
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.normal((a.batch, *a.shape))
    y = tf.random.uniform((a.batch,), 0, a.classes, dtype=tf.int64)
    value = lambda vs: [v.value for v in vs]   # noqa: E731  Keras 3 + Horovod (#4290)
    hvd.broadcast_variables(value(model.variables) + value(opt.variables), root_rank=0)

    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, value(model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = tf.function(lambda: train(x, y))      # the fixed batch is captured: no arguments
    fresh_step = tf.function(train)

    # As Horovod's tensorflow2 synthetic benchmark: the step's result is not fetched (eager
    # execution is synchronous, so the call returns when the step is done).
    read = fresh_batches(a, hvd.rank()) if a.fresh_data else None
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        if read:
            fresh_step(*map(tf.constant, read(i)))
        else:
            step()
        times.append(time.perf_counter() - t0)
    return steady(times, a.batch * hvd.size(), a.window) if hvd.rank() == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], required=True)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--model-ref", default=None, help="FILE.py:function, a user's model builder")
    ap.add_argument("--shape", type=int, nargs="+", default=[32])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--samples", type=int, default=None,
                    help="with --fresh-data: rows in memory (default: 2 x batch x steps)")
    ap.add_argument("--fresh-data", action="store_true",
                    help="a new batch each step, gathered from memory (not the baseline)")
    ap.add_argument("--window", type=int, default=0, metavar="STEPS",
                    help="also print the mean step of each STEPS-step window after warm-up")
    a = ap.parse_args()
    rate = (run_torch if a.backend == "torch" else run_tensorflow)(a)
    if rate is not None:
        print(json.dumps(rate), flush=True)


if __name__ == "__main__":
    main()
