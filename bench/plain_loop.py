"""A plain Horovod synthetic-benchmark loop (the baseline for `hpcsuite train`), in the style
of Horovod's own pytorch/tensorflow2 synthetic benchmarks: one fixed random batch, the same
model from models/, SGD with momentum, DistributedOptimizer / DistributedGradientTape.

Run under mpirun by bench/train_overhead.py; prints one JSON line on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import time



def steady(times: list[float], per_step: int) -> float:
    skip = min(10, len(times) // 10)          # the same warm-up rule as hpcsuite's results
    return per_step * len(times[skip:]) / sum(times[skip:])


def build_model(a, backend: str):
    """The built-in model, or with --model-ref the user's builder, loaded as hpcsuite does."""
    from hpcsuite import models, usercode

    ref = usercode.parse(a.model_ref) if a.model_ref else None
    if ref is None:
        return models.build(a.model, backend, tuple(a.shape), a.classes)
    return usercode.load(ref, usercode.search_dirs([]))(tuple(a.shape), a.classes)


def run_torch(a) -> float | None:
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
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return steady(times, a.batch * hvd.size()) if hvd.rank() == 0 else None


def run_tensorflow(a) -> float | None:
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

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, value(model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        float(step())
        times.append(time.perf_counter() - t0)
    return steady(times, a.batch * hvd.size()) if hvd.rank() == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", choices=["torch", "tensorflow"], required=True)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--model-ref", default=None, help="FILE.py:function, a user's model builder")
    ap.add_argument("--shape", type=int, nargs="+", default=[32])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    rate = (run_torch if a.backend == "torch" else run_tensorflow)(a)
    if rate is not None:
        print(json.dumps({"samples_per_s_steady": rate}), flush=True)


if __name__ == "__main__":
    main()
