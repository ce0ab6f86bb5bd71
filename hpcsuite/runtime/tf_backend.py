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
from ..spec import JobSpec, Optimizer
from .backend import HorovodBackend


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


def make_optimizer(keras, o: Optimizer, lr: float):
    """The Keras optimizer train.optimizer names; its learning rate is a variable the schedule
    sets every step."""
    wd = o.weight_decay or None
    if o.name == "adam":
        return keras.optimizers.Adam(learning_rate=lr, beta_1=o.betas[0], beta_2=o.betas[1],
                                     epsilon=o.eps, weight_decay=wd)
    if o.name == "adamw":
        return keras.optimizers.AdamW(learning_rate=lr, beta_1=o.betas[0], beta_2=o.betas[1],
                                      epsilon=o.eps, weight_decay=o.weight_decay)
    return keras.optimizers.SGD(learning_rate=lr, momentum=o.momentum, weight_decay=wd)


class TensorFlowBackend(HorovodBackend):
    name = "tensorflow"

    def __init__(self, job: JobSpec):
        self.tf, self.keras, self.horovod, hvd = _imports()
        super().__init__(job, hvd)
        tf = self.tf
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:                                     # one GPU per rank, by local rank
            gpu = gpus[self.local_rank % len(gpus)]
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.threading.set_intra_op_parallelism_threads(job.resources.cpus_per_task)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.keras.utils.set_random_seed(self.t.seed)

    def build(self, data) -> None:
        tf, keras, hvd = self.tf, self.keras, self.hvd
        self.check_loss_fits(data)
        self.classify = data.classes is not None
        if self.t.precision in ("mixed_float16", "amp"):
            keras.mixed_precision.set_global_policy("mixed_float16")
        self.model = self.make_model(data)
        if not isinstance(self.model, keras.Model):
            raise UserError(f"train.model: {self.t.model} returned {type(self.model).__name__}, "
                            "not a keras.Model (the job's backend is tensorflow)")
        self.user_loss_fn = self.user_loss()
        x, y = data.get(np.array([0, min(1, len(data) - 1)], dtype=np.int64))
        out = self.model(x, training=False)             # builds the model's variables too
        self.check_output(out.shape, len(x), data)
        self.check_per_sample(self.per_sample_loss(y, tf.cast(out, tf.float32)).shape, len(x))
        optimizer = make_optimizer(keras, self.t.optimizer, self.t.lr)
        self.mixed = keras.mixed_precision.global_policy().name == "mixed_float16"
        self.inner_optimizer = optimizer
        if self.mixed:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        self.optimizer.build(self.model.trainable_variables)
        h = self.t.horovod
        self.compression = hvd.Compression.fp16 if h.compression == "fp16" else hvd.Compression.none
        self.op = hvd.Adasum if h.op == "adasum" else hvd.Average
        train_vars = self.model.trainable_variables
        # Local gradient sums for accumulation over micro-batches (k > 1).
        self.accum = [tf.Variable(tf.zeros_like(v.value), trainable=False) for v in train_vars] \
            if self.t.grad_accumulation > 1 else []
        self._micro = tf.function(self._micro_step, reduce_retracing=True)
        self._eval = tf.function(self._eval_step, reduce_retracing=True)
        self._scales: dict[float, object] = {}
        self._poll: dict | None = None
        # Trace every variant now (batch dimension left open, so all batches match): a trace
        # costs a quarter of a second, which would otherwise land in some training step.
        ytype = tf.int64 if self.classify else tf.float32
        specs = (tf.TensorSpec([None, *data.shape], tf.float32),
                 tf.TensorSpec([None, *data.target_shape], ytype),
                 tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32))
        self._micro.get_concrete_function(*specs, True)
        self._micro.get_concrete_function(*specs, True, tf.TensorSpec([3], tf.int32))
        if self.t.grad_accumulation > 1:
            self._micro.get_concrete_function(*specs, False)

    def per_sample_loss(self, y, out):
        tf, keras = self.tf, self.keras
        if self.user_loss_fn is not None:
            return self.user_loss_fn(out, y)
        if self.t.loss == "mse":
            n = tf.shape(out)[0]
            diff = tf.reshape(out, [n, -1]) - tf.reshape(tf.cast(y, out.dtype), [n, -1])
            return tf.reduce_mean(tf.square(diff), axis=1)
        return keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)

    def set_lr(self, lr: float) -> None:
        self.inner_optimizer.learning_rate.assign(lr)

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
        shape, target = data.shape, tuple(data.target_shape)
        ytype = tf.int64 if data.classes is not None else tf.float32

        def fetch(i):
            return data.get(ids[int(i)])

        ds = tf.data.Dataset.range(len(batches))
        ds = ds.map(lambda i: (i, *tf.numpy_function(fetch, [i], [tf.float32, ytype])),
                    num_parallel_calls=d.workers, deterministic=True)
        ds = ds.map(lambda i, x, y: (i, tf.ensure_shape(x, (None, *shape)),
                                     tf.ensure_shape(y, (None, *target))))
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
            logits = self.tf.cast(self.model(x, training=True), self.tf.float32)
            per_sample = self.per_sample_loss(y, logits) * w
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
            if self.t.horovod.allreduce:
                dtape = hvd.DistributedGradientTape(tape, compression=self.compression, op=self.op)
                grads = dtape.gradient(target, tf_vars(model_vars))
            else:                            # the no-communication limit: no gradient allreduce
                grads = tape.gradient(target, tf_vars(model_vars))
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

    def micro_step(self, x, y, w, scale, last, padded=True):
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

    def _eval_step(self, x, y, w):
        tf = self.tf
        out = tf.cast(self.model(x, training=False), tf.float32)
        loss = tf.reduce_sum(self.per_sample_loss(y, out) * w)
        if not self.classify:
            return loss, tf.constant(0.0)
        hit = tf.cast(tf.equal(tf.argmax(out, axis=1), tf.cast(y, tf.int64)), tf.float32)
        return loss, tf.reduce_sum(hit * w)

    def eval_step(self, x, y, w) -> tuple[float, float]:
        loss, correct = self._eval(x, y, w)
        return float(loss), float(correct)

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

    def gradient_sizes(self) -> list[int]:
        """Elements of each gradient the allreduce carries (the trainable variables)."""
        return [int(np.prod(v.shape)) for v in self.model.trainable_variables]

    def checksum(self) -> str:
        h = hashlib.sha256()
        for v in sorted(self.model.variables, key=lambda v: v.path):
            h.update(v.path.encode())
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()

    def versions(self) -> dict:
        return {**self.common_versions(), "tensorflow": self.tf.__version__,
                "keras": self.keras.__version__}
