"""Data sources, framework-free: arrays indexed by sample id."""

from __future__ import annotations

import numpy as np

from ..spec import Data


class Synthetic:
    """A learnable classification set, deterministic from the seed: labels come from a
    fixed random linear teacher, so a model's loss can actually go down."""

    def __init__(self, spec: Data, seed: int):
        rng = np.random.default_rng([seed, 7919])
        self.x = rng.standard_normal((spec.samples, spec.features), dtype=np.float32)
        teacher = rng.standard_normal((spec.features, spec.classes), dtype=np.float32)
        self.y = np.argmax(self.x @ teacher, axis=1).astype(np.int64)
        self.features, self.classes = spec.features, spec.classes

    def __len__(self) -> int:
        return len(self.y)

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[ids], self.y[ids]


def open_data(spec: Data, seed: int):
    # JobSpec validation admits only the kinds implemented here.
    return {"synthetic": Synthetic}[spec.kind](spec, seed)
