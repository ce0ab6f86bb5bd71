"""The ranks' vote after a step, in one int32 Max allreduce: stop, save, the next vote
interval, and every rank's loss sum for that step.

Max over ranks answers the three questions (anyone wants to stop or save; the interval is sent
negated, so the Max is the smallest proposal). The loss needs a sum instead: each rank writes its
float64 loss sum, as two int32 words, into two slots of its own and INT32_MIN into everyone
else's, so the Max of a slot is its owner's words exactly (no word is below INT32_MIN) and every
rank gets every rank's value. The live loss in progress.json is then the global mean, the same
number results.json records for that step, at no extra collective. The vector is 3 + 2 x ranks
int32: 8 KiB at 1,000 ranks, once per vote interval."""

from __future__ import annotations

import struct
from dataclasses import dataclass

FIELDS = 3
_FILLER = -2 ** 31


@dataclass(frozen=True)
class Vote:
    stop: bool
    save: bool
    interval: int        # the smallest interval any rank proposed
    loss_sum: float      # the step's loss summed over every rank's samples


def length(size: int) -> int:
    """The vote's vector length for ``size`` ranks (fixed for a run: the TF graph's shape)."""
    return FIELDS + 2 * size


def encode(stop: bool, save: bool, interval: int, loss_sum: float, rank: int, size: int) -> list[int]:
    values = [int(stop), int(save), -int(interval)] + [_FILLER] * (2 * size)
    lo, hi = struct.unpack("<ii", struct.pack("<d", float(loss_sum)))
    values[FIELDS + 2 * rank], values[FIELDS + 2 * rank + 1] = lo, hi
    return values


def decode(values: list[int], size: int) -> Vote:
    """The vote from the Max-reduced vector (every rank decodes the same)."""
    words = values[FIELDS:FIELDS + 2 * size]
    total = sum(struct.unpack("<d", struct.pack("<ii", words[i], words[i + 1]))[0]
                for i in range(0, 2 * size, 2))
    return Vote(bool(values[0]), bool(values[1]), -int(values[2]), total)
