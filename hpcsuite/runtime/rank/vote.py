"""The ranks' vote after a step, in one int32 Max allreduce: stop, save, the next vote
interval, and every rank's loss sum for that step.

Max over ranks answers the three questions (anyone wants to stop or save; the interval is sent
negated, so the Max is the smallest proposal). The loss needs a sum instead: each rank writes its
float64 loss sum, as two int32 words, into two slots of its own and INT32_MIN into everyone
else's, so the Max of a slot is its owner's words exactly (no word is below INT32_MIN) and every
rank gets every rank's value. The live loss in progress.json is then the global mean, the same
number results.json records for that step, at no extra collective.

Each rank also sends, the same way, how its steps since the last vote split: its own time per
step (data, forward, backward, optimizer: everything but waiting for the others) and its wait
in the gradients' allreduce, in microseconds (-1: not measured, as in TensorFlow and in script
mode unless the script's allreduce is timed: ``Run.time_allreduce``). Rank 0 sees from them
which rank the others wait for (:mod:`hpcsuite.runs.stragglers`). The vector is 3 + 4 x ranks int32: 16 KiB at 1,000 ranks,
once per vote interval."""

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
    own: tuple = ()      # each rank's own seconds per step since its last vote (None: unknown)
    wait: tuple = ()     # each rank's seconds per step waiting in the allreduce (None: unknown)


PER_RANK = 4             # the loss (two words), own time, wait
_MAX_US = 2 ** 31 - 1


def length(size: int) -> int:
    """The vote's vector length for ``size`` ranks (fixed for a run: the TF graph's shape)."""
    return FIELDS + PER_RANK * size


def _us(seconds: float | None) -> int:
    if seconds is None or seconds != seconds or seconds < 0:
        return -1
    return min(_MAX_US, int(round(seconds * 1e6)))


def encode(stop: bool, save: bool, interval: int, loss_sum: float, rank: int, size: int,
           own: float | None = None, wait: float | None = None) -> list[int]:
    values = [int(stop), int(save), -int(interval)] + [_FILLER] * (PER_RANK * size)
    lo, hi = struct.unpack("<ii", struct.pack("<d", float(loss_sum)))
    at = FIELDS + 2 * rank
    values[at], values[at + 1] = lo, hi
    at = FIELDS + 2 * size + 2 * rank
    values[at], values[at + 1] = _us(own), _us(wait)
    return values


def decode(values: list[int], size: int) -> Vote:
    """The vote from the Max-reduced vector (every rank decodes the same)."""
    words = values[FIELDS:FIELDS + 2 * size]
    total = sum(struct.unpack("<d", struct.pack("<ii", words[i], words[i + 1]))[0]
                for i in range(0, 2 * size, 2))
    times = values[FIELDS + 2 * size:FIELDS + PER_RANK * size]
    seconds = [None if int(t) < 0 else int(t) / 1e6 for t in times]
    return Vote(bool(values[0]), bool(values[1]), -int(values[2]), total,
                tuple(seconds[0::2]), tuple(seconds[1::2]))
