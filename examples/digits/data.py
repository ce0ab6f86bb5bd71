"""The data factory of the digits example: scikit-learn's bundled handwritten digits.

1,797 8x8 grey images of the digits 0-9, shipped inside scikit-learn (no download), split once
into a training part (80 %, 1,437 images) and a held-out test part (20 %, 360 images) with
scikit-learn's ``train_test_split`` (stratified, fixed seed): every rank and every attempt sees
the same split.

hpcsuite calls ``digits(part=...)`` on every rank and reads batches through its sharding layer:
``len(ds)`` samples, ``ds[ids]`` -> (inputs, labels) for an array of sample ids.
"""

import numpy as np

TRAIN_FRACTION = 0.8
SPLIT_SEED = 0


class Digits:
    classes = 10

    def __init__(self, part: str = "train", image: bool = False):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        if part not in ("train", "test"):
            raise ValueError(f"part must be train or test, not {part!r}")
        bunch = load_digits()
        x = (bunch.data / 16.0).astype(np.float32)             # pixel values 0..16 -> 0..1
        y = bunch.target.astype(np.int64)
        x_train, x_test, y_train, y_test = train_test_split(
            x, y, train_size=TRAIN_FRACTION, stratify=y, random_state=SPLIT_SEED)
        x, y = (x_train, y_train) if part == "train" else (x_test, y_test)
        self.x = x.reshape(-1, 1, 8, 8) if image else x       # channels first for CNNs
        self.y = y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, ids):
        return self.x[ids], self.y[ids]


def digits(part: str = "train", image: bool = False) -> Digits:
    return Digits(part, image)
