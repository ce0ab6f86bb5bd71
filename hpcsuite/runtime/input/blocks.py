"""Reading a data source in blocks of micro-batches, into arrays used again.

A backend's step reads its micro-batches through :func:`read_block`: one ``get()`` on the
source (:mod:`.data`) and one conversion into the framework per block instead of per
micro-batch. Framework-free: the backends (:mod:`hpcsuite.runtime.frameworks.torch_backend`, :mod:`hpcsuite.runtime.frameworks.tf_backend`) turn a
:class:`Block`'s arrays into tensors.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

# Micro-batches are read in blocks: one get() and (in a backend) one conversion into the
# framework per block instead of per micro-batch. On millisecond steps those per-batch calls
# cost as much as a tenth of the step. A block stays around a mebibyte, so that large samples
# are still read one micro-batch at a time.
IN_PROCESS_BLOCK_BYTES = 1 << 20
MAX_BLOCK = 64


class Block(NamedTuple):
    """Consecutive micro-batches of one size, read together."""
    batches: list          # the sharding layer's Batch of each
    x: np.ndarray          # [k, B, *shape] float32
    y: np.ndarray          # [k, B, *target_shape]
    w: np.ndarray          # [k, B] float32 weights (0 for padding)


# A micro-batch of at least ALONE_BYTES and less than ALONE_MOST bytes of inputs is better
# read alone, into a new array, at the start of its step (PyTorch's in-process reads), as a plain
# loop reads it: per-call costs are small beside its copy, and it is still in cache when the
# forward pass reads it. Measured on 1 ms steps against blocks of two read into arrays used
# again: 2-3 % faster at 100-400 KB per micro-batch; blocks stay 4-5 % faster at 2-32 KB. At
# 1.6 MB (batch 512 of 784 floats, 2 ms steps) reading alone against a block of one read into
# an array used again: plain/managed 0.990 against 0.976, median of eight alternated runs
# (docs/BENCHMARKS.md). From ALONE_MOST up, glibc's malloc maps every new array afresh (its
# mmap threshold grows to at most 32 MiB), each a page fault per 4 KiB: those micro-batches are
# read into arrays used again (:class:`Buffers`).
ALONE_BYTES = 1 << 16
ALONE_MOST = 32 << 20


def reads_alone(data, batch: int) -> bool:
    """Whether micro-batches of ``batch`` samples of ``data`` are read one at a time into new
    arrays rather than in blocks (see ALONE_BYTES)."""
    return ALONE_BYTES <= micro_batch_bytes(data, batch) < ALONE_MOST


def micro_batch_bytes(data, batch: int) -> int:
    """Input bytes of a micro-batch of ``batch`` samples of ``data`` (float32)."""
    return 4 * int(np.prod(data.shape, dtype=np.int64)) * batch


def block_size(data, batch: int, max_bytes: int = IN_PROCESS_BLOCK_BYTES, most: int = MAX_BLOCK) -> int:
    """Micro-batches per block for micro-batches of ``batch`` samples of ``data``."""
    return int(max(1, min(most, max_bytes // max(1, micro_batch_bytes(data, batch)))))


def plan_blocks(batches: list, per_block: int) -> list[list]:
    """Consecutive micro-batches grouped by up to ``per_block`` of equal size (a sharder's
    micro-batches all have its batch size)."""
    groups, start = [], 0
    while start < len(batches):
        size = len(batches[start].ids)
        group = batches[start:start + per_block]
        group = group[:next((j for j, b in enumerate(group) if len(b.ids) != size), len(group))]
        groups.append(group)
        start += len(group)
    return groups


class Ones:
    """Weights of full micro-batches: one array or tensor of ones per shape, made by
    ``make(shape)`` the first time and handed out ever after. Never written: weights are only
    multiplied into new tensors. The one cache of them (numpy blocks, PyTorch on the CPU or a
    device)."""

    def __init__(self, make):
        self._make = make
        self._made: dict = {}

    def __call__(self, shape):
        made = self._made.get(shape)
        if made is None:
            made = self._made[shape] = self._make(shape)
        return made


class Buffers:
    """Arrays that blocks are read into, used again once nothing else refers to them.

    PyTorch's in-process reads keep here blocks of small micro-batches (up to a mebibyte in
    all) and micro-batches of ALONE_MOST bytes or more, which a new array would give fresh pages
    from the kernel each step. An array is handed out again only when the pool holds the sole
    reference to it: every tensor a framework made from it (``torch.from_numpy`` and its views
    keep the array alive), every numpy view and every block is gone, so nothing that can still
    be read sees it overwritten. Otherwise a new array is made (and kept while the pool has
    room)."""

    def __init__(self, most: int = 4):
        self.most = most
        self._pool: dict[tuple, list[np.ndarray]] = {}
        self.ones = Ones(lambda shape: np.ones(shape, np.float32))   # full micro-batches' weights
        # Where reference counts cannot be read, no array is ever handed out twice.
        self._reuse = hasattr(sys, "getrefcount")

    def take(self, shape: tuple, dtype) -> np.ndarray:
        arrays = self._pool.setdefault((shape, np.dtype(dtype).str), [])
        if self._reuse:
            for i in range(len(arrays)):
                # Two references: the pool's list and getrefcount's own argument.
                if sys.getrefcount(arrays[i]) == 2:
                    return arrays[i]
        a = np.empty(shape, dtype)
        if len(arrays) < self.most:
            arrays.append(a)
        return a


def read_block(data, group: list, buffers: Buffers | None = None) -> Block:
    """One get() for the micro-batches of ``group`` (into ``buffers`` where the source can)."""
    k, size = len(group), len(group[0].ids)
    ids = np.concatenate([b.ids for b in group]) if k > 1 else group[0].ids
    if buffers is not None and getattr(data, "reads_into", False):
        labels = np.int64 if data.classes is not None else np.float32
        x, y = data.get(ids, (buffers.take((len(ids), *data.shape), np.float32),
                              buffers.take((len(ids), *data.target_shape), labels)))
    else:
        x, y = data.get(ids)
    if buffers is not None and all(b.real == size for b in group):
        w = buffers.ones((k, size))
    else:
        w = np.stack([b.weights for b in group])
    return Block(group, x.reshape(k, size, *x.shape[1:]), y.reshape(k, size, *y.shape[1:]), w)

