"""Which samples each rank sees: one framework-free sharding layer for every backend.

Each epoch is a fresh permutation of the N sample ids, fixed by (seed, epoch). The epoch is
cut into global batches of W*B consecutive ids (W ranks, B per rank); rank r takes the r-th
slice of B. Because the order is global, progress is one number — the samples consumed this
epoch — and resuming with any world size continues with exactly the ids not yet seen.

Within a micro-batch the ids come in ascending order (the set is what the permutation chose).

Remainder policy: the epoch is padded up to whole optimizer steps (W*B*k slots for k
accumulated micro-batches) by repeating ids from the start of the permutation; those slots
carry weight 0 so they never count in loss or metrics. Every rank therefore runs the same
number of steps, and each real id appears exactly once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Cursor(NamedTuple):
    """Position in the sample stream: ``consumed`` real+padded slots into ``epoch``."""

    epoch: int = 0
    consumed: int = 0

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    @classmethod
    def from_json(cls, data: dict) -> "Cursor":
        return cls(int(data["epoch"]), int(data["consumed"]))


class Batch(NamedTuple):
    """One micro-batch of one rank (a named tuple: one is made per step, so it must be cheap)."""
    ids: np.ndarray       # int64 sample ids, length B
    weights: np.ndarray   # float32, 1 for real samples, 0 for padding
    real: int             # real samples in this micro-batch (weights.sum())
    step_real: int        # real samples in the whole optimizer step, across all ranks
    last_in_step: bool    # the optimizer steps after this micro-batch
    cursor: Cursor        # the position *after* this batch


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


class Sharder:
    def __init__(self, n: int, world: int, rank: int, batch: int, seed: int,
                 accumulation: int = 1):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of {world}")
        if n < 1 or batch < 1 or accumulation < 1:
            raise ValueError("need at least one sample, batch and accumulation step")
        self.n, self.world, self.rank, self.batch, self.seed = n, world, rank, batch, seed
        self.accumulation = accumulation

    @property
    def step_slots(self) -> int:
        """Slots one optimizer step consumes across all ranks."""
        return self.world * self.batch * self.accumulation

    def steps_per_epoch(self, consumed: int = 0) -> int:
        """Optimizer steps left in an epoch from ``consumed``."""
        return -(-max(self.n - consumed, 0) // self.step_slots)

    # Steps whose micro-batches are computed together: numpy works on whole blocks instead
    # of a dozen small calls per micro-batch, and a block's index arrays stay small.
    BLOCK_STEPS = 256

    def epoch(self, cursor: Cursor):
        """Yield this rank's micro-batches from ``cursor`` to the end of its epoch."""
        perm = permutation(self.n, self.seed, cursor.epoch)
        n, batch, k_last, step_slots = self.n, self.batch, self.accumulation - 1, self.step_slots
        micro, epoch, new = self.world * batch, cursor.epoch, tuple.__new__
        offsets = np.arange(self.accumulation)[:, None] * micro + self.rank * batch + \
            np.arange(batch)[None, :]                               # [K, B] within a step
        # Within a micro-batch the ids go in ascending order, ties (a padding slot repeating a
        # real id) in slot order: sorting id * B + position is that stable order, in one sort
        # of unique keys instead of an argsort and two gathers.
        keyed = n <= np.iinfo(np.int64).max // max(batch, 2)
        for first in range(cursor.consumed, n, step_slots * self.BLOCK_STEPS):
            starts = np.arange(first, min(first + step_slots * self.BLOCK_STEPS, n),
                               step_slots)                           # [S] step starts
            slots = starts[:, None, None] + offsets[None]             # [S, K, B]
            real = slots < n
            ids = perm[np.where(real, slots, slots % n)]
            if keyed:
                keys = np.sort(ids * batch + np.arange(batch), axis=-1)
                ids, position = np.divmod(keys, batch)
                real = np.take_along_axis(real, position, -1)
            else:
                order = np.argsort(ids, axis=-1, kind="stable")
                ids = np.take_along_axis(ids, order, -1)
                real = np.take_along_axis(real, order, -1)
            ids = ids.astype(np.int64, copy=False)
            weights, counts = real.astype(np.float32), real.sum(-1).tolist()
            for s, step_start in enumerate(starts.tolist()):
                step_real = min(n - step_start, step_slots)
                # Batch and Cursor built as plain tuples: a named tuple's __new__ costs more
                # than everything else here, once per micro-batch.
                after = new(Cursor, (epoch, min(step_start + step_slots, n)))
                if k_last == 0:
                    yield new(Batch, (ids[s, 0], weights[s, 0], counts[s][0], step_real, True,
                                      after))
                    continue
                within = new(Cursor, (epoch, step_start))
                for k in range(k_last + 1):
                    last = k == k_last
                    yield new(Batch, (ids[s, k], weights[s, k], counts[s][k], step_real, last,
                                      after if last else within))
