"""Data sources: synthetic determinism and memory-mapped npy shards."""

import numpy as np
import pytest

from hpcsuite.errors import UserError
from hpcsuite.runtime.input.data import NpyShards, Synthetic, open_data, write_shards
from hpcsuite.submit.spec import Data


def test_synthetic_is_deterministic_and_shaped():
    spec = Data(samples=50, shape=[3, 4, 4], classes=5)
    a, b = Synthetic(spec, 7), Synthetic(spec, 7)
    ids = np.array([3, 1, 49])
    np.testing.assert_array_equal(a.get(ids)[0], b.get(ids)[0])
    assert a.get(ids)[0].shape == (3, 3, 4, 4) and a.get(ids)[1].dtype == np.int64
    assert not np.array_equal(Synthetic(spec, 8).x, a.x)


def test_npy_shards_match_the_arrays(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((103, 2, 3)).astype(np.float32)
    y = rng.integers(0, 7, 103)
    write_shards(tmp_path, x, y, shards=4)
    data = open_data(Data(kind="npy", path=str(tmp_path)), 0)
    assert len(data) == 103 and data.shape == (2, 3) and data.classes == int(y.max()) + 1
    ids = rng.permutation(103)[:40]
    got_x, got_y = data.get(ids)
    np.testing.assert_array_equal(got_x, x[ids])
    np.testing.assert_array_equal(got_y, y[ids])
    assert not data.shards[0].inputs.flags.owndata     # a view of the memory map, not a copy


@pytest.mark.parametrize("damage, message", [
    ("missing-labels", "lack their inputs or labels file"),
    ("length", "labels for"),
    ("float-labels", "labels must be integers"),
    ("shape", "sample shape"),
    ("garbage", "not a readable .npy array"),
])
def test_npy_errors_name_the_file(tmp_path, damage, message):
    write_shards(tmp_path, np.zeros((10, 4), np.float32), np.zeros(10, np.int64), shards=2)
    if damage == "missing-labels":
        (tmp_path / "labels-00001.npy").unlink()
    elif damage == "length":
        np.save(tmp_path / "labels-00001.npy", np.zeros(3, np.int64))
    elif damage == "float-labels":
        np.save(tmp_path / "labels-00001.npy", np.zeros(5, np.float32))
    elif damage == "shape":
        np.save(tmp_path / "inputs-00001.npy", np.zeros((5, 5), np.float32))
    else:
        (tmp_path / "inputs-00001.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match=message):
        NpyShards(Data(kind="npy", path=str(tmp_path)), 0)


def test_npy_needs_a_directory(tmp_path):
    with pytest.raises(UserError, match="train.data.path: required"):
        NpyShards(Data(kind="npy"), 0)
    with pytest.raises(UserError, match="is not a directory"):
        NpyShards(Data(kind="npy", path=str(tmp_path / "nope")), 0)


def _batches(ids_per_batch):
    from hpcsuite.runtime.input.sharding import Batch, Cursor
    return [Batch(ids=np.asarray(ids), weights=np.ones(len(ids), np.float32), real=len(ids),
                  step_real=len(ids), last_in_step=True, cursor=Cursor(0, 0))
            for ids in ids_per_batch]


@pytest.mark.parametrize("kind", ["synthetic", "npy", "subset"])
def test_reading_into_buffers_gives_the_same_samples(tmp_path, kind):
    from hpcsuite.runtime.input.blocks import Buffers, read_block
    from hpcsuite.runtime.input.data import Subset

    rng = np.random.default_rng(3)
    data = Synthetic(Data(samples=120, shape=[5], classes=4), 1)
    if kind == "npy":
        write_shards(tmp_path, data.x, data.y, shards=3)
        data = open_data(Data(kind="npy", path=str(tmp_path)), 0)
    elif kind == "subset":
        data = Subset(data, np.sort(rng.permutation(120)[:90]))
    buffers = Buffers()
    for ids in ([np.sort(rng.permutation(len(data))[:8]) for _ in range(3)]
                + [rng.permutation(len(data))[:8]]):           # unsorted ids too
        group = _batches([ids[:4], ids[4:]])
        fresh, reused = read_block(data, group), read_block(data, group, buffers)
        np.testing.assert_array_equal(reused.x, fresh.x)
        np.testing.assert_array_equal(reused.y, fresh.y)
        assert reused.y.dtype == fresh.y.dtype == np.int64


def test_a_buffer_is_used_again_only_when_nothing_refers_to_it():
    import torch
    from hpcsuite.runtime.input.blocks import Buffers, read_block

    data = Synthetic(Data(samples=64, shape=[3], classes=2), 0)
    buffers = Buffers(most=2)
    first = read_block(data, _batches([np.arange(4)]), buffers)
    held = torch.from_numpy(first.x).unbind(0)[0]        # a view a model might keep
    base = id(first.x.base)          # an id: a reference here would keep the array busy
    del first
    second = read_block(data, _batches([np.arange(4, 8)]), buffers)
    assert id(second.x.base) != base                     # still referred to: not reused
    np.testing.assert_array_equal(held.numpy(), data.x[:4])
    del held, second
    third = read_block(data, _batches([np.arange(8, 12)]), buffers)
    assert id(third.x.base) == base                      # free again: from the pool
    np.testing.assert_array_equal(third.x[0], data.x[8:12])
    # A pool that is full and busy still reads: a new array, not kept.
    blocks = [read_block(data, _batches([np.arange(i, i + 4)]), buffers) for i in range(0, 40, 4)]
    for i, b in enumerate(blocks):
        np.testing.assert_array_equal(b.x[0], data.x[4 * i:4 * i + 4])


def test_full_blocks_share_ones_and_padded_blocks_keep_their_weights():
    from hpcsuite.runtime.input.blocks import Buffers, read_block

    data = Synthetic(Data(samples=64, shape=[3], classes=2), 0)
    buffers = Buffers()
    full = read_block(data, _batches([np.arange(4), np.arange(4, 8)]), buffers)
    assert full.w.shape == (2, 4) and np.all(full.w == 1)
    padded = _batches([np.arange(4), np.array([8, 9, 9, 9])])
    padded[1] = padded[1]._replace(weights=np.array([1, 1, 0, 0], np.float32), real=2)
    block = read_block(data, padded, buffers)
    np.testing.assert_array_equal(block.w[1], [1, 1, 0, 0])
    assert np.all(full.w == 1)                  # the shared ones were not written


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "blocks"])
def test_torch_reads_the_same_micro_batches_alone_or_in_blocks(monkeypatch, alone):
    """PyTorch's in-process reads take big micro-batches one at a time and small ones in
    blocks: either way each micro-batch is its ids' samples, with its padding's zero weights."""
    import torch
    from hpcsuite.runtime.frameworks import torch_backend
    from hpcsuite.runtime.input.blocks import Buffers, Ones
    from hpcsuite.runtime.input.sharding import Cursor, Sharder

    monkeypatch.setattr(torch_backend, "reads_alone", lambda data, batch: alone)
    backend = object.__new__(torch_backend.TorchBackend)      # no Horovod needed to read
    backend.torch, backend._buffers, backend._read_next = torch, Buffers(), None
    backend._full_on_cpu = Ones(lambda n: torch.ones(n))
    data = Synthetic(Data(samples=50, shape=[6], classes=4), 2)
    batches = list(Sharder(50, 2, 1, 8, 5).epoch(Cursor(0, 0)))
    assert batches[-1].real < 8                                 # the last one is padded
    got = list(backend._read_in_process(data, batches))
    assert [b for b, _ in got] == batches
    for batch, (x, y, w) in got:
        want_x, want_y = data.get(batch.ids)
        np.testing.assert_array_equal(x.numpy(), want_x)
        np.testing.assert_array_equal(y.numpy(), want_y)
        np.testing.assert_array_equal(w.numpy(), batch.weights)


def test_which_micro_batches_are_read_alone():
    from hpcsuite.runtime.input.blocks import reads_alone

    def of(shape):
        return Synthetic(Data(samples=4, shape=shape, classes=2), 0)
    assert not reads_alone(of([16]), 32)            # 2 KB: blocks of 64
    assert reads_alone(of([784]), 128)              # 401 KB: alone
    assert reads_alone(of([784]), 512)              # 1.6 MB: alone
    assert not reads_alone(of([3, 224, 224]), 64)   # 38.5 MB: a block of one, into reused arrays
