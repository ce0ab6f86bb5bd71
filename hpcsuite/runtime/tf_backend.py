"""TensorFlow 2.21 / Keras 3 on horovod.tensorflow: DistributedGradientTape, broadcast from rank 0.

Keras 3 breaks Horovod's TensorFlow API (horovod issue #4290): its variables are not
``tf.Variable`` and have no ``.ref()``, so ``DistributedGradientTape.gradient`` and
``broadcast_variables`` fail on ``model.trainable_variables``. Every call into Horovod here
passes the underlying ``tf.Variable`` of each Keras variable (``v.value``) instead.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import UserError
from ..spec import JobSpec


def _imports():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        import keras
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise UserError(f"hpcsuite train (backend tensorflow) cannot import {e.name}: {e}; install "
                        "tensorflow and Horovod on the compute nodes (scripts/setup.sh) or load "
                        "the site's modules in the profile") from None
    return tf, keras, horovod, hvd


def tf_vars(variables) -> list:
    """The tf.Variable under each Keras 3 variable (Horovod needs .ref())."""
    return [getattr(v, "value", v) for v in variables]


class TensorFlowBackend:
    name = "tensorflow"

    def __init__(self, job: JobSpec):
        self.tf, self.keras, self.horovod, self.hvd = _imports()
        self.job, self.t = job, job.train
        tf, hvd = self.tf, self.hvd
        hvd.init()
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:                                     # one GPU per rank, by local rank
            gpu = gpus[self.local_rank % len(gpus)]
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.threading.set_intra_op_parallelism_threads(job.resources.cpus_per_task)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.keras.utils.set_random_seed(self.t.seed)

    def build(self, shape, classes) -> None:
        from hpcsuite import models

        tf, keras, hvd = self.tf, self.keras, self.hvd
        if self.t.precision in ("mixed_float16", "amp"):
            keras.mixed_precision.set_global_policy("mixed_float16")
        self.model = models.build(self.t.model, "tensorflow", shape, classes)
        optimizer = keras.optimizers.SGD(learning_rate=self.t.lr, momentum=0.9)
        self.mixed = keras.mixed_precision.global_policy().name == "mixed_float16"
        if self.mixed:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        self.optimizer.build(self.model.trainable_variables)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        h = self.t.horovod
        self.compression = hvd.Compression.fp16 if h.compression == "fp16" else hvd.Compression.none
        self.op = hvd.Adasum if h.op == "adasum" else hvd.Average
        train_vars = self.model.trainable_variables
        # Local gradient sums for accumulation over micro-batches (k > 1).
        self.accum = [tf.Variable(tf.zeros_like(v.value), trainable=False) for v in train_vars] \
            if self.t.grad_accumulation > 1 else []
        self._micro = tf.function(self._micro_step, reduce_retracing=True)
        self._scales: dict[float, object] = {}
        self._poll: dict | None = None
        # Trace every variant now (batch dimension left open, so all batches match): a trace
        # costs a quarter of a second, which would otherwise land in some training step.
        specs = (tf.TensorSpec([None, *shape], tf.float32), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32))
        self._micro.get_concrete_function(*specs, True)
        self._micro.get_concrete_function(*specs, True, tf.TensorSpec([2], tf.int32))
        if self.t.grad_accumulation > 1:
            self._micro.get_concrete_function(*specs, False)

    # ---------------------------------------------------------------- data
    def feed(self, data, batches):
        tf = self.tf
        if not batches:
            return
        d = self.t.data
        if d.workers == 0:
            # In-process loading: a tf.data pipeline around numpy would only add per-batch cost.
            for b in batches:
                x, y = data.get(b.ids)
                yield b, tf.constant(x), tf.constant(y), tf.constant(b.weights)
            return
        ids = np.stack([b.ids for b in batches])
        weights = np.stack([b.weights for b in batches])
        shape = data.shape

        def fetch(i):
            return data.get(ids[int(i)])

        ds = tf.data.Dataset.range(len(batches))
        ds = ds.map(lambda i: (i, *tf.numpy_function(fetch, [i], [tf.float32, tf.int64])),
                    num_parallel_calls=d.workers, deterministic=True)
        ds = ds.map(lambda i, x, y: (i, tf.ensure_shape(x, (None, *shape)), tf.ensure_shape(y, (None,))))
        ds = ds.prefetch(d.prefetch)
        for i, x, y in ds:
            i = int(i)
            yield batches[i], x, y, tf.constant(weights[i])

    # ---------------------------------------------------------------- step
    def _micro_step(self, x, y, w, scale, last, poll=None):
        tf, hvd = self.tf, self.hvd
        model_vars = self.model.trainable_variables
        accumulate = self.t.grad_accumulation > 1
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            per_sample = self.loss_fn(y, logits) * w
            loss = tf.reduce_sum(per_sample) * scale
            if self.mixed:
                loss = self.optimizer.scale_loss(loss)
            target = loss
            if accumulate and last:
                # Fold the locally accumulated gradients into the target:
                # d/dv <stop_gradient(acc), v> = acc, so the one allreduce that
                # DistributedGradientTape performs carries the whole step's gradient.
                target = loss + tf.add_n([tf.reduce_sum(tf.stop_gradient(a) * tf.cast(v.value, a.dtype))
                                          for a, v in zip(self.accum, model_vars)])
        if last:
            dtape = hvd.DistributedGradientTape(tape, compression=self.compression, op=self.op)
            grads = dtape.gradient(target, tf_vars(model_vars))
            self.optimizer.apply_gradients(zip(grads, model_vars))
            if accumulate:
                for a in self.accum:
                    a.assign(tf.zeros_like(a))
        else:
            grads = tape.gradient(loss, tf_vars(model_vars))
            for a, g in zip(self.accum, grads):
                a.assign_add(g)
        if poll is not None:
            # The ranks' stop/save vote rides along with this step's gradient allreduce.
            return tf.reduce_sum(per_sample), hvd.allreduce(poll, op=hvd.Max, name="hpcsuite.poll")
        return tf.reduce_sum(per_sample)

    def micro_step(self, x, y, w, scale, last):
        tf = self.tf
        if scale not in self._scales:           # a handful of values: full and last steps
            self._scales[scale] = tf.constant(scale, tf.float32)
        poll = self._poll
        if last and poll is not None and "sent" not in poll:
            poll["sent"] = True
            loss, poll["result"] = self._micro(x, y, w, self._scales[scale], True,
                                               tf.constant(poll["values"], tf.int32))
            return loss
        return self._micro(x, y, w, self._scales[scale], bool(last))

    def poll_start(self, values):
        """The vote is sent with the next optimizer step (see _micro_step), not on its own."""
        self._poll = {"values": list(values)}
        return self._poll

    def poll_result(self, handle):
        if "sent" not in handle:                # training ended before another step ran
            handle["sent"] = True
            handle["result"] = self.hvd.allreduce(self.tf.constant(handle["values"], self.tf.int32),
                                                  op=self.hvd.Max, name="hpcsuite.poll")
        if self._poll is handle:
            self._poll = None
        return [int(v) for v in handle["result"].numpy()]

    def losses_to_floats(self, losses):
        return [float(v) for v in losses]

    # ---------------------------------------------------------------- state
    def state(self):
        model = {v.path: np.asarray(v.numpy()) for v in self.model.variables}
        optim = {v.path: np.asarray(v.numpy()) for v in self.optimizer.variables}
        return {"model": model, "optimizer": optim}, {}

    def load_state(self, tensors, extra):
        for group, variables in (("model", self.model.variables),
                                 ("optimizer", self.optimizer.variables)):
            saved = tensors.get(group, {})
            names = {v.path for v in variables}
            if set(saved) != names:
                missing = sorted(names - set(saved))[:3]
                unknown = sorted(set(saved) - names)[:3]
                raise ValueError(f"{group} variables differ: missing {missing}, unexpected {unknown}")
            for v in variables:
                if tuple(saved[v.path].shape) != tuple(v.shape):
                    raise ValueError(f"{v.path}: shape {saved[v.path].shape} != {tuple(v.shape)}")
                v.assign(saved[v.path])

    def broadcast_state(self):
        self.hvd.broadcast_variables(tf_vars(self.model.variables) + tf_vars(self.optimizer.variables),
                                     root_rank=0)

    def broadcast_object(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0, name="hpcsuite.object")

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj, name="hpcsuite.gather")

    def checksum(self) -> str:
        h = hashlib.sha256()
        for v in sorted(self.model.variables, key=lambda v: v.path):
            h.update(v.path.encode())
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()

    def versions(self) -> dict:
        from mpi4py import MPI

        return {"tensorflow": self.tf.__version__, "keras": self.keras.__version__,
                "horovod": self.horovod.__version__,
                "mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 "),
                "numpy": np.__version__}

    def shutdown(self):
        self.hvd.shutdown()
