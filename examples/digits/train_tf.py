"""Script mode, TensorFlow / Keras 3: your own Horovod training loop, with hpcsuite's sharding,
checkpoints, preemption and results (see hpcsuite.api).

    cd examples/digits && hpcsuite submit digits-script-tf.yaml --wait

By hand, in one process: `HPCSUITE_SPEC=digits-script-tf.yaml python train_tf.py`.

Checkpoints hold the model and the optimizer (its iterations, moments and learning rate):
api.keras_state() and api.load_keras_state().

Keras 3 variables are not tf.Variables, which Horovod's TensorFlow API needs (horovod issue
#4290): pass ``v.value`` (the tf.Variable underneath) to DistributedGradientTape and
broadcast_variables, as below.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from data import digits  # noqa: E402
from hpcsuite import api  # noqa: E402
from model import build_keras  # noqa: E402


def tf_vars(variables):
    return [v.value for v in variables]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.002)
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    run = api.Run(hvd)
    keras.utils.set_random_seed(run.job.train.seed)
    train, test = digits("train"), digits("test")
    model = build_keras((64,), 10)
    optimizer = keras.optimizers.AdamW(learning_rate=args.lr * hvd.size())
    optimizer.build(model.trainable_variables)

    restored = run.restore()
    if restored:                                  # every rank reads the same checkpoint
        api.load_keras_state(model, optimizer, restored.state)   # the model and the optimizer
    else:                                         # a fresh start: rank 0's weights everywhere
        hvd.broadcast_variables(tf_vars(model.variables) + tf_vars(optimizer.variables), root_rank=0)

    @tf.function(reduce_retracing=True)
    def step(x, y, w, scale):
        with tf.GradientTape() as tape:
            per_sample = keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True) * w
            loss = tf.reduce_sum(per_sample) * scale
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, tf_vars(model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_sum(per_sample)

    for batch in run.batches(len(train)):
        x, y = train[batch.ids]
        # Horovod averages over ranks: scale so the step's loss is the mean over its real samples.
        loss_sum = step(x, y, batch.weights, tf.constant(hvd.size() / batch.step_real, tf.float32))
        run.log(loss=float(loss_sum) / max(batch.real, 1))
        if run.should_stop():
            run.save(api.keras_state(model, optimizer))
            break
        if run.checkpoint_due():
            run.save(api.keras_state(model, optimizer))
    else:
        run.save(api.keras_state(model, optimizer), reason="final")

    ids = np.arange(hvd.rank(), len(test), hvd.size())
    x, y = test[ids]
    correct = int(np.sum(np.argmax(model(x, training=False), axis=1) == y))
    correct = sum(hvd.allgather_object(correct))
    run.finish(params=api.keras_state(model)["model"], test_accuracy=correct / len(test))


if __name__ == "__main__":
    main()
