"""bench/scale.py's baseline: the same tiny MLP and step as scale_script.py with horovod.torch
alone (no hpcsuite.api), launched by the same template as a script-mode job. Each rank draws
its batches from its own seeded generator; ``--steps`` steps, no checkpoint, no results.json.

    train: {script: scale_plain.py, args: [--steps, "40"]}
"""

import argparse

import horovod.torch as hvd
import numpy as np
import torch

import scale_loss

SAMPLES, WIDTH, CLASSES = 8192, 32, 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((SAMPLES, WIDTH), dtype=np.float32)
    y = rng.integers(0, CLASSES, SAMPLES)
    torch.manual_seed(1234)
    model = scale_loss.build_mlp(WIDTH, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    ids_rng = np.random.default_rng(1234 + hvd.rank())
    for _ in range(args.steps):
        ids = np.sort(ids_rng.choice(SAMPLES, args.batch, replace=False))
        per_sample = scale_loss.per_sample(model(torch.from_numpy(x[ids])), torch.from_numpy(y[ids]))
        loss = per_sample.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
