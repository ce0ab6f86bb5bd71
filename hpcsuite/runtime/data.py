"""Data sources, framework-free: arrays of samples addressed by global sample id.

Both backends read through the same object and the same sharding index stream; their adapters
(:mod:`.torch_backend`, :mod:`.tf_backend`) only move batches into the framework.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..spec import Data

SHARD = re.compile(r"^(inputs|labels)-(\d+)\.npy$")


class Synthetic:
    """A learnable classification set, deterministic from the seed: labels come from a fixed
    random linear teacher over the flattened input, so a model's loss can actually go down."""

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

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[ids], self.y[ids]


@dataclass(frozen=True)
class _Shard:
    inputs: np.ndarray   # memory-mapped
    labels: np.ndarray


class NpyShards:
    """A directory of ``inputs-NNNNN.npy`` (float32, [n, *shape]) and ``labels-NNNNN.npy``
    (integers, [n]) pairs, opened as memory maps: only the rows a rank asks for are read."""

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

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``ids`` in the given order. The sharding layer hands out each batch's ids in
        ascending order, so each shard's rows are one contiguous run of the output, read
        front to back."""
        if len(ids) > 1 and not np.all(ids[1:] >= ids[:-1]):
            order = np.argsort(ids, kind="stable")
            x, y = self.get(ids[order])
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            return x[inverse], y[inverse]
        x = np.empty((len(ids), *self.shape), dtype=np.float32)
        y = np.empty(len(ids), dtype=np.int64)
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


def open_data(spec: Data, seed: int):
    if spec.kind == "npy":
        return NpyShards(spec, seed)
    return Synthetic(spec, seed)
