"""TensorFlow 2.21 / Keras 3 on horovod.tensorflow: DistributedGradientTape, broadcast from rank 0.

Keras 3 breaks Horovod's TensorFlow API (horovod issue #4290): its variables are not
``tf.Variable`` and have no ``.ref()``, so ``DistributedGradientTape.gradient`` and
``broadcast_variables`` fail on ``model.trainable_variables``. Every call into Horovod here
passes the underlying ``tf.Variable`` of each Keras variable (``v.value``) instead.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os

import numpy as np

from ...errors import UserError
from ...usercode import blame
from ...submit.spec import JobSpec, Optimizer
from .backend import HorovodBackend
from ..rank.startup import OFF
from ..rank import vote
from ..input.blocks import MAX_BLOCK, block_size, plan_blocks, read_block


def _imports():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
        import keras
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise UserError(f"hpcsuite train (backend tensorflow) cannot import {e.name}: {e}; install "
                        "tensorflow and Horovod on the compute nodes (hpcsuite-build-horovod) or load "
                        "the site's modules in the profile") from None
    return tf, keras, horovod, hvd


def device_prefetch(gpus, depth: int) -> str | None:
    """Where each step's block is copied ahead of the step: the first GPU TensorFlow sees, with
    ``train.data.prefetch`` blocks in flight; None (no GPU or depth 0): blocks stay on the host."""
    return "/gpu:0" if gpus and depth > 0 else None


def to_device(tf, blocks, device: str, depth: int):
    """(group, (xs, ys, ws)) with the arrays as tensors on ``device``, copied ``depth`` blocks
    ahead (tf.data prefetch, copy_to_device, prefetch). The groups are not prefetched: one is
    handed on only with its block, so the loop's cursor counts trained micro-batches only."""
    blocks = iter(blocks)
    first = next(blocks, None)
    if first is None:
        return
    pending = collections.deque()            # groups whose arrays the pipeline has taken, in order

    def source():
        for group, arrays in itertools.chain([first], blocks):
            pending.append(group)
            yield arrays
    spec = tuple(tf.TensorSpec((None,) + a.shape[1:], tf.as_dtype(a.dtype)) for a in first[1])
    ds = tf.data.Dataset.from_generator(source, output_signature=spec).prefetch(depth)
    ds = ds.apply(tf.data.experimental.copy_to_device(device))
    with tf.device(device):
        ds = ds.prefetch(depth)
    for tensors in ds:
        yield pending.popleft(), tensors


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


def graph_caller(concrete):
    """A callable running ``concrete`` (a traced step) on its tensor arguments, returning the
    list of its output tensors.

    Calling a ``tf.function`` costs ~0.45 ms of Python per call with four tensor arguments on
    this project's machine (signature binding, trace-type hashing, cache lookup), and calling
    its concrete function still ~0.19 ms: as much as a whole small training step. What a
    ``ConcreteFunction`` does after binding, when no outer tape records (none does here), is run
    its inference function on the arguments followed by ``captured_inputs``; this does that
    directly, ~0.08 ms. The captures are the handles of the model's and optimizer's variables,
    all created before tracing and only ever assigned, so they are read once."""
    fn = getattr(concrete, "inference_fn", None)
    if fn is None or not hasattr(fn, "call_flat"):     # another TensorFlow: the public call
        import tensorflow as tf

        return lambda *args: tf.nest.flatten(concrete(*args))
    call, captures = fn.call_flat, tuple(concrete.captured_inputs)
    return lambda *args: call(*args, *captures)


class TensorFlowBackend(HorovodBackend):
    name = "tensorflow"

    def __init__(self, job: JobSpec, watch=OFF):
        self.tf, self.keras, self.horovod, hvd = _imports()
        super().__init__(job, hvd, watch)
        tf = self.tf
        gpus = tf.config.list_physical_devices("GPU")
        self.device = f"cuda:{self.local_rank % len(gpus)}" if gpus else "cpu"
        if gpus:                                     # one GPU per rank, by local rank
            gpu = gpus[self.local_rank % len(gpus)]
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.threading.set_intra_op_parallelism_threads(job.resources.cpus_per_task)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.keras.utils.set_random_seed(self.train.seed)

    def build(self, data) -> None:
        tf, keras, hvd = self.tf, self.keras, self.hvd
        self.check_loss_fits(data)
        self.classify = data.classes is not None
        if self.train.precision in ("mixed_float16", "amp"):
            keras.mixed_precision.set_global_policy("mixed_float16")
        self.model = self.make_model(data)
        if not isinstance(self.model, keras.Model):
            raise UserError(f"train.model: {self.train.model} returned {type(self.model).__name__}, "
                            "not a keras.Model (the job's backend is tensorflow)")
        self.user_loss_fn = self.user_loss()
        x, y = data.get(np.array([0, min(1, len(data) - 1)], dtype=np.int64))
        with blame("train.model", self.train.model):
            out = self.model(x, training=False)         # builds the model's variables too
        self._seen_dtype = self._compute_dtype(x)
        self.check_output(out.shape, len(x), data)
        with blame("train.loss", self.train.loss):
            loss = self.per_sample_loss(y, tf.cast(out, tf.float32))
        self.check_per_sample(loss.shape, len(x))
        optimizer = make_optimizer(keras, self.train.optimizer, self.train.lr)
        self.mixed = keras.mixed_precision.global_policy().name == "mixed_float16"
        self.inner_optimizer = optimizer
        if self.mixed:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        self.optimizer = optimizer
        self.optimizer.build(self.model.trainable_variables)
        h = self.train.horovod
        self.compression = hvd.Compression.fp16 if h.compression == "fp16" else hvd.Compression.none
        self.op = hvd.Adasum if h.op == "adasum" else hvd.Average
        train_vars = self.model.trainable_variables
        # Local gradient sums for accumulation over micro-batches (k > 1).
        self.accum = [tf.Variable(tf.zeros_like(v.value), trainable=False) for v in train_vars] \
            if self.train.grad_accumulation > 1 else []
        micro = tf.function(self._micro_step, reduce_retracing=True)
        self._eval = tf.function(self._eval_step, reduce_retracing=True)
        self._scales: dict[float, object] = {}
        self._index = [tf.constant(i, tf.int32) for i in range(MAX_BLOCK)]
        self._device = None                  # '/gpu:0': blocks prefetched to it; '': host
        self._poll: dict | None = None
        # Trace every variant now (block and batch dimensions left open, so all blocks match):
        # a trace costs a quarter of a second, which would otherwise land in some training step.
        ytype = tf.int64 if self.classify else tf.float32
        specs = (tf.TensorSpec([None, None, *data.shape], tf.float32),
                 tf.TensorSpec([None, None, *data.target_shape], ytype),
                 tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([], tf.int32),
                 tf.TensorSpec([], tf.float32))
        self._step = graph_caller(micro.get_concrete_function(*specs, True))
        self._poll_step = graph_caller(micro.get_concrete_function(
            *specs, True, tf.TensorSpec([vote.length(self.size)], tf.int32)))
        self._accumulate_step = graph_caller(micro.get_concrete_function(*specs, False)) \
            if self.train.grad_accumulation > 1 else None

    def per_sample_loss(self, y, out):
        tf, keras = self.tf, self.keras
        if self.user_loss_fn is not None:
            return self.user_loss_fn(out, y)
        if self.train.loss == "mse":
            n = tf.shape(out)[0]
            diff = tf.reshape(out, [n, -1]) - tf.reshape(tf.cast(y, out.dtype), [n, -1])
            return tf.reduce_mean(tf.square(diff), axis=1)
        return keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)

    def set_lr(self, lr: float) -> None:
        self.inner_optimizer.learning_rate.assign(lr)

    # ---------------------------------------------------------------- data
    def feed(self, data, batches):
        """(batch, inputs) for each micro-batch. Micro-batches come in blocks (see
        :func:`hpcsuite.runtime.input.blocks.read_block`): one tensor per field for the block, and the step graph takes
        its micro-batch by index, so no tensor is made per step. inputs: (xs, ys, ws, index)."""
        tf = self.tf
        if not batches:
            return
        d, index, constant = self.train.data, self._index, tf.constant
        if d.workers == 0:
            # In-process loading: a tf.data pipeline around numpy would only add per-batch cost.
            groups = plan_blocks(batches, block_size(data, len(batches[0].ids)))
            blocks = ((g, (b.x, b.y, b.w)) for g, b in ((g, read_block(data, g)) for g in groups))
        else:
            # With workers: the run's loader processes (:mod:`hpcsuite.runtime.input.workers`, started once), fed each
            # epoch's blocks (a tf.data pipeline built every epoch cost ~45 ms an epoch to trace).
            blocks = ((g, (xs, ys, np.stack([b.weights for b in g])))
                      for g, xs, ys in self.from_workers(data, batches))
        if self._device is None:
            self._device = device_prefetch(tf.config.list_physical_devices("GPU"), d.prefetch) or ""
        if self._device:
            # On a GPU: each block is copied to the device ahead of its steps (tf.data).
            blocks = to_device(tf, blocks, self._device, d.prefetch)
        for group, (xs, ys, ws) in blocks:
            if not self._device:
                xs, ys, ws = constant(xs), constant(ys), constant(ws)
            for i, b in enumerate(group):
                yield b, (xs, ys, ws, index[i])

    # ---------------------------------------------------------------- step
    def _micro_step(self, xs, ys, ws, i, scale, last, poll=None):
        tf, hvd = self.tf, self.hvd
        x, y, w = xs[i], ys[i], ws[i]            # the micro-batch i of its block
        model_vars = self.model.trainable_variables
        accumulate = self.train.grad_accumulation > 1
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
            if self.train.horovod.allreduce:
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

    def micro_step(self, inputs, scale, last, padded=True):
        s = self._scales.get(scale)
        if s is None:                           # a handful of values: full and last steps
            s = self._scales[scale] = self.tf.constant(scale, self.tf.float32)
        if not last:
            return self._accumulate_step(*inputs, s)[0]
        poll = self._poll
        if poll is not None and "sent" not in poll:
            poll["sent"] = True
            loss, poll["result"] = self._poll_step(*inputs, s,
                                                   self.tf.constant(poll["values"], self.tf.int32))
            return loss
        return self._step(*inputs, s)[0]

    def vote_start(self, values):
        """The vote is sent with the next optimizer step (see _micro_step), not on its own."""
        self._poll = {"values": list(values)}
        return self._poll

    def vote_result(self, handle):
        if "sent" not in handle:                # training ended before another step ran
            handle["sent"] = True
            handle["result"] = self.hvd.allreduce(self.tf.constant(handle["values"], self.tf.int32),
                                                  op=self.hvd.Max, name="hpcsuite.poll")
        if self._poll is handle:
            self._poll = None
        return [int(v) for v in handle["result"].numpy()]

    def allreduce_sums(self, values: list[float]) -> list[float]:
        t = self.tf.constant(values, self.tf.float64)
        return self.hvd.allreduce(t, op=self.hvd.Sum, name="hpcsuite.sums").numpy().tolist()

    def losses_to_floats(self, losses):
        # One stacking op and one read for many steps' scalar float32 losses (the values exactly).
        return self.tf.stack(losses).numpy().tolist() if losses else []

    def _eval_step(self, xs, ys, ws, i):
        tf = self.tf
        x, y, w = xs[i], ys[i], ws[i]
        out = tf.cast(self.model(x, training=False), tf.float32)
        loss = tf.reduce_sum(self.per_sample_loss(y, out) * w)
        if not self.classify:
            return loss, tf.constant(0.0)
        hit = tf.cast(tf.equal(tf.argmax(out, axis=1), tf.cast(y, tf.int64)), tf.float32)
        return loss, tf.reduce_sum(hit * w)

    def eval_step(self, inputs) -> tuple[float, float]:
        loss, correct = self._eval(*inputs)
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

    def _compute_dtype(self, x) -> str | None:
        """The dtype the model's first layer with weights computes in, by calling it on a real
        batch (the output layer is float32 under a mixed policy, so the model's output tells
        nothing): the evidence in results.json that train.precision took effect."""
        first = next((layer for layer in self.model.layers if layer.weights), None)
        if first is None:
            return None
        try:
            return self.tf.as_dtype(first(x).dtype).name
        except Exception:                    # a layer that does not take the raw inputs
            return str(first.compute_dtype)

    def precision_seen(self) -> dict:
        return {"compute_dtype": self._seen_dtype, "loss_scaling": self.mixed,
                "param_dtype": self.tf.as_dtype(self.model.trainable_variables[0].dtype).name
                if self.model.trainable_variables else None}   # Keras 3: dtype is a string

    def versions(self) -> dict:
        return {**self.common_versions(), "tensorflow": self.tf.__version__,
                "keras": self.keras.__version__}
