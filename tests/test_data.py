"""Data sources: synthetic determinism and memory-mapped npy shards."""

import numpy as np
import pytest

from hpcsuite.errors import UserError
from hpcsuite.runtime.data import NpyShards, Synthetic, open_data, write_shards
from hpcsuite.spec import Data


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
