"""TensorFlow's input on a GPU: blocks copied to the device ahead of the step (tf.data
copy_to_device + prefetch). No GPU runs here, so the pipeline is pointed at '/cpu:0'."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hpcsuite.runtime.frameworks.tf_backend import device_prefetch, to_device


def test_device_prefetch_only_with_a_gpu_and_a_depth():
    assert device_prefetch(["GPU:0"], 2) == "/gpu:0"
    assert device_prefetch([], 2) is None
    assert device_prefetch(["GPU:0"], 0) is None


def _blocks(n, taken):
    for k in range(n):
        taken.append(k)
        x = np.full((4, 3), k, np.float32)
        yield [f"b{k}.{i}" for i in range(4)], (x, np.full(4, k, np.int64), np.ones(4, np.float32))


def test_blocks_arrive_in_order_exactly_once_on_the_target_device():
    taken = []
    out = list(to_device(tf, _blocks(5, taken), "/cpu:0", 2))
    assert [g[0] for g, _ in out] == [f"b{k}.0" for k in range(5)]
    for k, (group, (xs, ys, ws)) in enumerate(out):
        assert "CPU:0" in xs.device
        assert float(xs[0, 0]) == k and int(ys[0]) == k and len(group) == 4
    assert taken == list(range(5))


def test_a_stop_mid_epoch_counts_trained_batches_not_prefetched_ones():
    taken = []
    trained = []
    it = to_device(tf, _blocks(8, taken), "/cpu:0", 3)
    for group, _ in it:
        trained.extend(group)                 # the loop's cursor: micro-batches trained
        if len(trained) == 8:
            break                             # the stop: blocks are in flight
    it.close()
    assert len(taken) > 2                     # the pipeline had read ahead
    assert trained == [f"b{k}.{i}" for k in range(2) for i in range(4)]


def test_empty_epoch():
    assert list(to_device(tf, iter([]), "/cpu:0", 2)) == []
