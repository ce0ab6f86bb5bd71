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

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cursor:
    """Position in the sample stream: ``consumed`` real+padded slots into ``epoch``."""

    epoch: int = 0
    consumed: int = 0

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    @classmethod
    def from_json(cls, data: dict) -> "Cursor":
        return cls(int(data["epoch"]), int(data["consumed"]))


@dataclass(frozen=True)
class Batch:
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

    def epoch(self, cursor: Cursor):
        """Yield this rank's micro-batches from ``cursor`` to the end of its epoch."""
        perm = permutation(self.n, self.seed, cursor.epoch)
        micro = self.world * self.batch
        step_start = cursor.consumed
        while step_start < self.n:
            step_real = min(self.n - step_start, self.step_slots)
            for k in range(self.accumulation):
                start = step_start + k * micro + self.rank * self.batch
                slots = np.arange(start, start + self.batch)
                real = slots < self.n
                ids = perm[np.where(real, slots, slots % self.n)]
                # Ascending ids within a micro-batch: order inside a batch does not matter
                # to the loss, and sorted ids let the loader read each shard front to back.
                order = np.argsort(ids, kind="stable")
                ids, real = ids[order], real[order]
                last = k == self.accumulation - 1
                after = min(step_start + self.step_slots, self.n) if last else step_start
                yield Batch(ids=ids.astype(np.int64), weights=real.astype(np.float32),
                            real=int(real.sum()), step_real=step_real, last_in_step=last,
                            cursor=Cursor(cursor.epoch, after))
            step_start += self.step_slots
