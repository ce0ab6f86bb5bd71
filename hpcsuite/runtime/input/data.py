"""Data sources, framework-free: arrays of samples addressed by global sample id.

Both backends read through the same object and the same sharding index stream, in blocks of
micro-batches (:mod:`.blocks`); their adapters (:mod:`hpcsuite.runtime.frameworks.torch_backend`, :mod:`hpcsuite.runtime.frameworks.tf_backend`) only
move batches into the framework.

Every source has ``len()``, ``get(ids) -> (inputs float32, targets)``, ``shape`` (one input),
``classes`` (the number of classes when targets are integer labels, else None) and
``target_shape`` (``()`` for labels, the shape of one float target otherwise). Kinds:
synthetic, npy shards, HDF5 (h5py, read row by row like the memory maps) and a user's own
map-style dataset from a factory function. Sources with ``reads_into = True`` also take
``get(ids, out=(inputs, labels))`` and fill those arrays (see :class:`.blocks.Buffers`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...submit.spec import Data

SHARD = re.compile(r"^(inputs|labels)-(\d+)\.npy$")


class Synthetic:
    """A learnable classification set, deterministic from the seed: labels come from a fixed
    random linear teacher over the flattened input, so a model's loss can actually go down."""

    target_shape: tuple[int, ...] = ()
    reads_into = True

    def __init__(self, spec: Data, seed: int):
        rng = np.random.default_rng([seed, 7919])
        self.shape = tuple(spec.shape)
        width = int(np.prod(self.shape))
        x = rng.standard_normal((spec.samples, width), dtype=np.float32)
        teacher = rng.standard_normal((width, spec.classes), dtype=np.float32)
        self.y = np.argmax(x @ teacher, axis=1).astype(np.int64)
        self.x = x.reshape((spec.samples, *self.shape))
        self.classes = spec.classes

    def __len__(self) -> int:
        return len(self.y)

    def get(self, ids: np.ndarray, out=None) -> tuple[np.ndarray, np.ndarray]:
        if out is None:
            return self.x[ids], self.y[ids]
        # "clip" instead of the default "raise": with ``out`` numpy would read through a
        # temporary copy to keep the output intact on a bad id (the sharding layer's ids are
        # always in range).
        return (np.take(self.x, ids, axis=0, out=out[0], mode="clip"),
                np.take(self.y, ids, out=out[1], mode="clip"))


@dataclass(frozen=True)
class _Shard:
    inputs: np.ndarray   # memory-mapped
    labels: np.ndarray


class NpyShards:
    """A directory of ``inputs-NNNNN.npy`` (float32, [n, *shape]) and ``labels-NNNNN.npy``
    (integers, [n]) pairs, opened as memory maps: only the rows a rank asks for are read."""

    target_shape: tuple[int, ...] = ()
    reads_into = True

    def __init__(self, spec: Data, seed: int, root: Path | None = None):
        if not spec.path:
            raise UserError("train.data.path: required when train.data.kind is npy")
        self.root = Path(root or spec.path)
        if not self.root.is_dir():
            raise UserError(f"train.data.path: {self.root} is not a directory")
        found: dict[str, dict[str, Path]] = {"inputs": {}, "labels": {}}
        for p in self.root.iterdir():
            m = SHARD.match(p.name)
            if m:
                found[m.group(1)][m.group(2)] = p
        if not found["inputs"]:
            raise UserError(f"{self.root}: no inputs-NNNNN.npy shards")
        if found["inputs"].keys() != found["labels"].keys():
            odd = sorted(found["inputs"].keys() ^ found["labels"].keys())
            raise UserError(f"{self.root}: shards {', '.join(odd)} lack their inputs or labels file")
        self.shards = []
        for key in sorted(found["inputs"]):
            x = _open(found["inputs"][key])
            y = _open(found["labels"][key])
            if len(x) != len(y):
                raise UserError(f"{found['labels'][key]}: {len(y)} labels for {len(x)} inputs")
            if not np.issubdtype(y.dtype, np.integer):
                raise UserError(f"{found['labels'][key]}: labels must be integers, not {y.dtype}")
            if self.shards and x.shape[1:] != self.shards[0].inputs.shape[1:]:
                raise UserError(f"{found['inputs'][key]}: sample shape {x.shape[1:]} differs from "
                                f"{self.shards[0].inputs.shape[1:]} in the first shard")
            self.shards.append(_Shard(x, y))
        self.shape = tuple(self.shards[0].inputs.shape[1:])
        self.offsets = np.cumsum([0] + [len(s.labels) for s in self.shards])
        self.classes = int(max(int(s.labels.max()) for s in self.shards if len(s.labels)) + 1)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def get(self, ids: np.ndarray, out=None) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``ids`` in the given order. The sharding layer hands out each batch's ids in
        ascending order, so each shard's rows are one contiguous run of the output, read
        front to back."""
        if len(ids) > 1 and not np.all(ids[1:] >= ids[:-1]):
            order = np.argsort(ids, kind="stable")
            x, y = self.get(ids[order])
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            if out is None:
                return x[inverse], y[inverse]
            return (np.take(x, inverse, axis=0, out=out[0], mode="clip"),
                    np.take(y, inverse, out=out[1], mode="clip"))
        if out is None:
            x = np.empty((len(ids), *self.shape), dtype=np.float32)
            y = np.empty(len(ids), dtype=np.int64)
        else:
            x, y = out
        bounds = np.searchsorted(ids, self.offsets)
        for s, shard in enumerate(self.shards):
            a, b = bounds[s], bounds[s + 1]
            if a < b:
                local = ids[a:b] - self.offsets[s]
                x[a:b] = shard.inputs[local]
                y[a:b] = shard.labels[local]
        return x, y


def _open(path: Path) -> np.ndarray:
    """A read-only memory map of ``path``, as a plain ndarray view: numpy.memmap's subclass
    hooks cost more than the copy itself on every small gather."""
    try:
        return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a readable .npy array ({e})") from None


def write_shards(root: Path, x: np.ndarray, y: np.ndarray, shards: int) -> list[Path]:
    """Write arrays as npy shards in the layout :class:`NpyShards` reads."""
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards))):
        for name, arr in (("inputs", xs.astype(np.float32)), ("labels", ys.astype(np.int64))):
            path = root / f"{name}-{i:05d}.npy"
            np.save(path, arr)
            written.append(path)
    return written


class Hdf5:
    """Two datasets of one HDF5 file: ``inputs`` [N, *shape] and ``labels`` [N] (integers:
    classes) or [N, ...] (floats: regression targets). Rows are read on demand, as with the
    npy memory maps; the file is opened in each process that reads it (a loader worker
    must not share an h5py handle with its parent)."""

    def __init__(self, spec: Data, seed: int, key: str = "train.data"):
        if not spec.path:
            raise UserError("train.data.path: required when train.data.kind is hdf5")
        self.path, self.keys, self.key = Path(spec.path), (spec.inputs, spec.labels), key
        self._pid = None
        x, y = self._open()
        if len(x) != len(y):
            raise UserError(f"{self.path}: {len(y)} rows in {spec.labels} for {len(x)} in {spec.inputs}")
        if len(x) == 0:
            raise UserError(f"{self.path}: {spec.inputs} is empty")
        self.shape = tuple(x.shape[1:])
        self._y_int = np.issubdtype(y.dtype, np.integer)
        if self._y_int:
            if y.ndim != 1:
                raise UserError(f"{self.path}: integer labels {spec.labels} must be one per row, "
                                f"not shape {y.shape}")
            self.classes, self.target_shape = _label_count(y, f"{self.path}:{spec.labels}"), ()
        elif np.issubdtype(y.dtype, np.floating):
            self.classes, self.target_shape = None, tuple(y.shape[1:])
        else:
            raise UserError(f"{self.path}: {spec.labels} holds {y.dtype}; use integers (classes) "
                            "or floats (targets)")

    def _open(self):
        import os

        if self._pid != os.getpid():
            try:
                import h5py
            except ImportError as e:
                raise UserError(f"train.data.kind hdf5 needs h5py on the compute nodes ({e})") from None
            try:
                self._file = h5py.File(self.path, "r")
            except (OSError, ValueError) as e:
                raise UserError(f"{self.path}: not a readable HDF5 file ({e})") from None
            missing = [(k, f) for k, f in zip(self.keys, ("inputs", "labels"))
                       if k not in self._file]
            if missing:
                names: list[str] = []
                self._file.visititems(lambda n, o: names.append(n)
                                      if isinstance(o, h5py.Dataset) else None)
                raise UserError(f"{getattr(self, 'key', 'train.data')}.{missing[0][1]}: "
                                f"{self.path}: no dataset {missing[0][0]!r}; the file's "
                                f"datasets: {', '.join(sorted(names)[:12]) or 'none'}")
            self._x, self._y = (self._file[k] for k in self.keys)
            self._pid = os.getpid()
        return self._x, self._y

    def __len__(self) -> int:
        return len(self._open()[0])

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, y = self._open()
        unique, inverse = np.unique(ids, return_inverse=True)   # h5py wants increasing, distinct
        if len(unique) and unique[-1] - unique[0] + 1 == len(unique):
            rows = slice(int(unique[0]), int(unique[-1]) + 1)    # one contiguous read
            xs, ys = x[rows], y[rows]
        else:
            xs, ys = x[unique], y[unique]
        xs = np.asarray(xs, dtype=np.float32)[inverse]
        ys = np.asarray(ys, dtype=np.int64 if self._y_int else np.float32)[inverse]
        return xs, ys

    def __getstate__(self):   # loader workers reopen the file
        return {k: v for k, v in self.__dict__.items() if k not in ("_file", "_x", "_y", "_pid")} | {"_pid": None}


class Python:
    """A user's map-style dataset from ``train.data.factory``: ``len(ds)`` samples and
    ``ds[ids]`` -> (inputs, targets) arrays for an array of sample ids. ``ds.classes`` may give
    the number of classes; otherwise integer targets are counted once, in chunks."""

    def __init__(self, spec: Data, seed: int, key: str = "train.data.factory",
                 dirs: list[Path] | None = None):
        from ... import usercode

        if not spec.factory:
            raise UserError(f"{key}: required when the data kind is python")
        self.key, self.ref = key, spec.factory
        with usercode.blame(key, spec.factory):
            factory = usercode.load(usercode.parse(spec.factory), dirs or usercode.search_dirs([]))
            self.ds = factory(**spec.args)
        try:
            n = len(self.ds)
        except TypeError:
            raise UserError(f"{key}: {spec.factory} returned {type(self.ds).__name__}, which has "
                            "no len(); a dataset needs __len__ and __getitem__(ids)") from None
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise UserError(f"{key}: {spec.factory} returned a dataset of length {n!r}")
        self.n = int(n)
        x, y = self._fetch(np.array([0], dtype=np.int64))
        self.shape = tuple(x.shape[1:])
        self._y_int = np.issubdtype(y.dtype, np.integer)
        if self._y_int:
            if y.ndim != 1:
                raise UserError(f"{key}: integer targets must be one label per sample, got shape "
                                f"{tuple(y.shape[1:])} per sample")
            declared = getattr(self.ds, "classes", None)
            self.classes = int(declared) if isinstance(declared, (int, np.integer)) else \
                self._count_classes()
            self.target_shape: tuple[int, ...] = ()
        else:
            self.classes, self.target_shape = None, tuple(y.shape[1:])

    def _fetch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        try:
            out = self.ds[ids]
        except BaseException:  # noqa: BLE001 - named by its key, re-raised
            from ...usercode import blame

            with blame(self.key, self.ref):
                raise
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise UserError(f"{self.key}: {self.ref}: ds[ids] must return (inputs, targets), "
                            f"got {type(out).__name__}")
        x, y = np.asarray(out[0]), np.asarray(out[1])
        if len(x) != len(ids) or len(y) != len(ids):
            raise UserError(f"{self.key}: {self.ref}: ds[ids] for {len(ids)} ids returned "
                            f"{len(x)} inputs and {len(y)} targets")
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise UserError(f"{self.key}: {self.ref}: targets are {y.dtype}; use integers "
                            "(classes) or floats")
        return x, y

    def _count_classes(self) -> int:
        top = -1
        for start in range(0, self.n, 65536):
            _, y = self._fetch(np.arange(start, min(start + 65536, self.n), dtype=np.int64))
            top = max(top, int(y.max()))
        return top + 1

    def __len__(self) -> int:
        return self.n

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The dataset was checked when opened; per batch only what it returned is converted
        # (every step pays for this call, so no more than that).
        x, y = self.ds[ids]
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        want = np.int64 if self._y_int else np.float32
        if y.dtype != want:
            y = y.astype(want)
        if len(x) != len(ids) or len(y) != len(ids):
            raise UserError(f"{self.key}: {self.ref}: ds[ids] for {len(ids)} ids returned "
                            f"{len(x)} inputs and {len(y)} targets")
        return x, y


class Subset:
    """The samples ``ids`` (ascending) of ``data``, renumbered 0..len-1: ascending local ids
    stay ascending, so the readers keep reading front to back."""

    def __init__(self, data, ids: np.ndarray):
        self.data, self.ids = data, np.asarray(ids, dtype=np.int64)
        self.shape, self.classes = data.shape, data.classes
        self.target_shape = getattr(data, "target_shape", ())
        self.reads_into = getattr(data, "reads_into", False)

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, ids: np.ndarray, out=None) -> tuple[np.ndarray, np.ndarray]:
        if out is None:
            return self.data.get(self.ids[ids])
        return self.data.get(self.ids[ids], out)


def split_ids(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training ids, held-out ids), both ascending: a fixed random ``fraction`` held out,
    decided by the seed alone (the same split on every rank, attempt and world size)."""
    held = int(round(n * fraction))
    if fraction > 0 and not 0 < held < n:
        raise UserError(f"train.eval.split: {fraction:g} of {n} samples leaves "
                        f"{n - held} for training and {held} for validation")
    perm = np.random.default_rng([seed, 104729]).permutation(n)
    return np.sort(perm[held:]), np.sort(perm[:held])


def _label_count(y, where: str) -> int:
    top = -1
    for start in range(0, len(y), 1 << 20):
        chunk = np.asarray(y[start:start + (1 << 20)])
        if len(chunk) and int(chunk.min()) < 0:
            raise UserError(f"{where}: negative class label {int(chunk.min())}")
        top = max(top, int(chunk.max()) if len(chunk) else -1)
    return top + 1


def open_data(spec: Data, seed: int, key: str = "train.data", dirs: list[Path] | None = None):
    """The source ``spec`` describes; ``dirs``: where user code is looked for."""
    if spec.kind == "npy":
        return NpyShards(spec, seed)
    if spec.kind == "hdf5":
        return Hdf5(spec, seed, key)
    if spec.kind == "python":
        return Python(spec, seed, f"{key}.factory", dirs)
    return Synthetic(spec, seed)


TRAINING, HELD_OUT = 0, 1      # a Recipe's ``which``


@dataclass(frozen=True)
class Recipe:
    """What a loader worker process needs to open a rank's data again: the job's train section,
    the seed and the search directories, and ``which`` of the two (TRAINING or HELD_OUT)."""
    train: object
    seed: int
    dirs: list[Path] | None
    which: int = TRAINING

    def reopen(self, which: int | None = None):
        """The data (``which`` of the two, this recipe's by default), opened in this process."""
        return _train_eval(self.train, self.seed, self.dirs)[self.which if which is None else which]


def open_train_eval(train, seed: int, dirs: list[Path] | None = None):
    """(training data, held-out data or None) for ``train`` (the job's train section); each
    carries a :class:`Recipe` with which a loader worker process opens the same data again."""
    data, held = _train_eval(train, seed, dirs)
    data.recipe = Recipe(train, seed, dirs, TRAINING)
    if held is not None:
        held.recipe = Recipe(train, seed, dirs, HELD_OUT)
    return data, held


def _train_eval(train, seed: int, dirs: list[Path] | None):
    data = open_data(train.data, seed, dirs=dirs)
    ev = train.eval
    if ev is None or not ev.enabled:
        return data, None
    if ev.data is not None:
        held = open_data(ev.data, seed, "train.eval.data", dirs)
        if held.shape != data.shape or held.target_shape != data.target_shape or \
                (held.classes is None) != (data.classes is None) or \
                (held.classes or 0) > (data.classes or 0):
            raise UserError(f"train.eval.data: samples of shape {held.shape} with "
                            f"{held.classes or held.target_shape} classes/targets do not match "
                            f"the training data ({data.shape}, {data.classes or data.target_shape})")
        return data, held
    train_ids, held_ids = split_ids(len(data), ev.split, seed)
    return Subset(data, train_ids), Subset(data, held_ids)
