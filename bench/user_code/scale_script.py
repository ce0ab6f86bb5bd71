"""bench/scale.py's script-mode job: a tiny MLP trained through hpcsuite.api (its sharding,
step log, stop votes and results), on synthetic data made here. The step clock and the planted
stall are scale_loss.py's, as in the managed job and the plain script.

    train: {script: scale_script.py, batch_size: 64, max_steps: 40}
"""

import horovod.torch as hvd
import numpy as np
import torch

import scale_loss
from hpcsuite import api

SAMPLES, WIDTH, CLASSES = 8192, 32, 10


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    run = api.Run(hvd)
    rng = np.random.default_rng(run.job.train.seed)
    x = rng.standard_normal((SAMPLES, WIDTH), dtype=np.float32)
    y = rng.integers(0, CLASSES, SAMPLES)
    torch.manual_seed(run.job.train.seed)
    model = scale_loss.build_mlp(WIDTH, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=run.job.train.lr * hvd.size(),
                                momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = run.time_allreduce(
        hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters()))
    for batch in run.batches(SAMPLES):
        weights = torch.from_numpy(batch.weights)
        per_sample = scale_loss.per_sample(model(torch.from_numpy(x[batch.ids])),
                                           torch.from_numpy(y[batch.ids]))
        loss = (per_sample * weights).sum() * hvd.size() / batch.step_real
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(loss=float((per_sample * weights).sum().detach()) / max(batch.real, 1))
        if run.should_stop():
            break
    run.finish()


if __name__ == "__main__":
    main()
