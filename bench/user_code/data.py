"""A user's map-style dataset for bench/train_overhead.py --user: random inputs and labels held
in memory, read through hpcsuite's sharding layer by sample ids."""

import numpy as np


class InMemory:
    def __init__(self, samples, shape, classes, seed):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((samples, *shape), dtype=np.float32)
        self.y = rng.integers(0, classes, samples)
        self.classes = classes

    def __len__(self):
        return len(self.y)

    def __getitem__(self, ids):
        return self.x[ids], self.y[ids]


def random_data(samples=1024, shape=(32,), classes=10, seed=0):
    return InMemory(samples, tuple(shape), classes, seed)
