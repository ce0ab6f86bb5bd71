"""The learning rate at each optimizer step, framework-free.

The rate is a function of how far training has got *in epochs* (a fraction: the sharding
cursor's epoch plus the share of it consumed), not of the step number, so a run resumed from a
checkpoint continues the schedule exactly, also on another number of ranks (where a step covers
a different share of an epoch).

- peak = lr x ranks with ``scale_by_world_size`` (Horovod's linear scaling rule), else lr;
- warm-up: a straight line over ``warmup_epochs`` up to the peak, starting from lr when scaling
  (the single-rank rate, as Goyal et al. and Horovod's warm-up callback do) and from 0 otherwise;
- then ``constant``; ``step``: x gamma every ``step_epochs``; ``cosine``: half a cosine from the
  peak down to ``min_lr`` at the last epoch.
"""

from __future__ import annotations

import math

from ...submit.spec import Schedule


def peak_rate(s: Schedule, lr: float, world: int) -> float:
    return lr * world if s.scale_by_world_size else lr


def learning_rate(s: Schedule, lr: float, world: int, progress: float, total_epochs: float) -> float:
    """The rate for the step that brings training to ``progress`` epochs (so the first step of
    a warm-up from 0 already moves)."""
    peak = peak_rate(s, lr, world)
    if s.warmup_epochs > 0 and progress < s.warmup_epochs:
        start = lr if s.scale_by_world_size else 0.0
        return start + (peak - start) * progress / s.warmup_epochs
    after = max(progress - s.warmup_epochs, 0.0)
    if s.decay == "step":
        return peak * s.gamma ** math.floor(after / s.step_epochs)
    if s.decay == "cosine":
        span = max(total_epochs - s.warmup_epochs, 1e-12)
        done = min(after / span, 1.0)
        return s.min_lr + (peak - s.min_lr) * 0.5 * (1.0 + math.cos(math.pi * done))
    return peak
