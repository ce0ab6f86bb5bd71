"""HDF5 and python-factory datasets, validation splits: framework-free, read by sample id."""

import numpy as np
import pytest

from hpcsuite.errors import UserError
from hpcsuite.runtime.input.data import Hdf5, Python, Subset, open_train_eval, split_ids
from hpcsuite.runtime.input.sharding import Cursor, Sharder
from hpcsuite.submit.spec import spec_from_dict


def data_spec(**kw):
    return spec_from_dict({"name": "x", "train": {"data": kw}}, "t").train.data


@pytest.fixture
def h5file(tmp_path):
    import h5py

    path = tmp_path / "d.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["train/x"] = rng.standard_normal((50, 3, 4)).astype(np.float64)
        f["train/y"] = rng.integers(0, 6, 50)
        f["reg/x"] = rng.standard_normal((20, 5)).astype(np.float32)
        f["reg/y"] = rng.standard_normal((20, 2)).astype(np.float32)
    return path


def test_hdf5_classes_any_order_and_duplicates(h5file):
    import h5py

    d = Hdf5(data_spec(kind="hdf5", path=str(h5file), inputs="train/x", labels="train/y"), 0)
    with h5py.File(h5file) as f:
        x_all, y_all = f["train/x"][:], f["train/y"][:]
    assert (len(d), d.shape, d.classes, d.target_shape) == (50, (3, 4), int(y_all.max()) + 1, ())
    ids = np.array([7, 3, 3, 49, 0])
    x, y = d.get(ids)
    assert x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_allclose(x, x_all[ids].astype(np.float32))
    np.testing.assert_array_equal(y, y_all[ids])
    x, _ = d.get(np.arange(10, 20))                 # a contiguous run: one slice read
    np.testing.assert_allclose(x, x_all[10:20].astype(np.float32))


def test_hdf5_regression_targets(h5file):
    d = Hdf5(data_spec(kind="hdf5", path=str(h5file), inputs="reg/x", labels="reg/y"), 0)
    assert (d.classes, d.target_shape) == (None, (2,))
    assert d.get(np.array([1, 2]))[1].dtype == np.float32


@pytest.mark.parametrize("kw, message", [
    ({"inputs": "nope"}, "no dataset 'nope'"),
    ({"inputs": "train/x", "labels": "reg/y"}, "20 rows in reg/y for 50 in train/x"),
])
def test_hdf5_problems(h5file, kw, message):
    with pytest.raises(UserError, match=message):
        Hdf5(data_spec(kind="hdf5", path=str(h5file), **kw), 0)


def test_hdf5_not_a_file(tmp_path):
    (tmp_path / "x.h5").write_text("not hdf5")
    with pytest.raises(UserError, match="not a readable HDF5 file"):
        Hdf5(data_spec(kind="hdf5", path=str(tmp_path / "x.h5")), 0)


FACTORY = """
import numpy as np

class Squares:
    def __init__(self, n, classes=None):
        self.n = n
        if classes:
            self.classes = classes
    def __len__(self):
        return self.n
    def __getitem__(self, ids):
        ids = np.asarray(ids)
        return np.stack([ids, ids ** 2], 1).astype(np.float64), ids % 3

def make(n=12, classes=None):
    return Squares(n, classes)

def regression(n=5):
    class R:
        def __len__(self):
            return n
        def __getitem__(self, ids):
            return np.ones((len(ids), 2)), np.zeros((len(ids), 4), np.float64)
    return R()

def no_len():
    return object()

def bad_tuple():
    class B:
        def __len__(self):
            return 3
        def __getitem__(self, ids):
            return np.ones((len(ids), 2))
    return B()
"""


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "mydata.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_python_factory_dataset(factory_dir):
    d = Python(data_spec(kind="python", factory="mydata.py:make", args={"n": 12}), 0)
    assert (len(d), d.shape, d.classes, d.target_shape) == (12, (2,), 3, ())   # classes counted
    x, y = d.get(np.array([2, 5]))
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.tolist() == [[2, 4], [5, 25]]
    declared = Python(data_spec(kind="python", factory="mydata.py:make", args={"classes": 7}), 0)
    assert declared.classes == 7
    reg = Python(data_spec(kind="python", factory="mydata.py:regression"), 0)
    assert (reg.classes, reg.target_shape) == (None, (4,))


@pytest.mark.parametrize("factory, message", [
    ("mydata.py:no_len", "returned object, which has no len()"),
    ("mydata.py:bad_tuple", r"ds\[ids\] must return \(inputs, targets\)"),
])
def test_python_factory_problems(factory_dir, factory, message):
    with pytest.raises(UserError, match=message):
        Python(data_spec(kind="python", factory=factory), 0)


def test_split_is_fixed_disjoint_and_complete():
    a, b = split_ids(100, 0.2, seed=5)
    assert len(b) == 20 and len(a) == 80 and not set(a) & set(b) and set(a) | set(b) == set(range(100))
    assert list(a) == sorted(a) and list(b) == sorted(b)
    a2, b2 = split_ids(100, 0.2, seed=5)
    assert (a == a2).all() and (b == b2).all()
    assert not (split_ids(100, 0.2, seed=6)[1] == b).all()
    with pytest.raises(UserError, match="leaves"):
        split_ids(3, 0.1, seed=1)


def test_train_eval_split_every_sample_once_across_ranks(factory_dir):
    train = spec_from_dict({"name": "x", "train": {
        "data": {"kind": "python", "factory": "mydata.py:make", "args": {"n": 103}},
        "eval": {"split": 0.25}}}, "t").train
    data, held = open_train_eval(train, 9)
    assert isinstance(data, Subset) and (len(data), len(held)) == (77, 26)
    assert (held.recipe.reopen().ids == held.ids).all()     # what a loader worker reopens
    seen = []
    for rank in range(3):
        for b in Sharder(len(held), 3, rank, 4, 9).epoch(Cursor()):
            seen += list(held.ids[b.ids[b.weights > 0]])
    assert sorted(seen) == sorted(held.ids)                 # each held-out sample exactly once
    x, _ = held.get(np.array([0, 1]))
    assert x[:, 0].tolist() == held.ids[:2].tolist()


def test_held_out_data_must_match(factory_dir):
    train = spec_from_dict({"name": "x", "train": {
        "data": {"kind": "python", "factory": "mydata.py:make"},
        "eval": {"data": {"kind": "python", "factory": "mydata.py:regression"}}}}, "t").train
    with pytest.raises(UserError, match="train.eval.data: samples of shape"):
        open_train_eval(train, 0)
