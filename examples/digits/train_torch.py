"""Script mode, PyTorch: your own Horovod training loop, with hpcsuite's sharding, checkpoints,
preemption and results (see hpcsuite.api).

    cd examples/digits && hpcsuite submit digits-script-torch.yaml --wait

hpcsuite launches this file on every rank (`train.script`), with `train.args` as its arguments.
The same file runs by hand in one process too, with the spec resolved here (outputs in
runs/digits-script-torch/local/):

    HPCSUITE_SPEC=digits-script-torch.yaml python train_torch.py

Checkpoints hold the model and the optimizer (AdamW's moments and step counts, its learning
rate): api.torch_state() makes them numpy arrays for run.save(), api.load_torch_state() puts
them back, so a resumed run continues exactly where the saved one was.
"""

import argparse

import horovod.torch as hvd
import numpy as np
import torch

from data import digits
from hpcsuite import api
from model import build


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.002)
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    run = api.Run(hvd)                            # the job spec, run directory, rank and size
    train, test = digits("train"), digits("test")
    torch.manual_seed(run.job.train.seed)
    model = build((64,), 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr * hvd.size())
    restored = run.restore()                      # the latest checkpoint, if this job has one
    if restored:                                  # (every rank reads the same one)
        api.load_torch_state(model, optimizer, restored.state)   # the model and the optimizer
    else:                                         # a fresh start: rank 0's weights everywhere
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    optimizer = run.time_allreduce(optimizer)     # each rank's wait apart: the slow rank named

    for batch in run.batches(len(train)):         # this rank's share of each epoch
        x, y = train[batch.ids]
        weights = torch.from_numpy(batch.weights)  # 0 for the padding of the last step
        per_sample = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                       torch.from_numpy(y), reduction="none")
        # Horovod averages over ranks: scale so the step's loss is the mean over its real samples.
        loss = (per_sample * weights).sum() * hvd.size() / batch.step_real
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(loss=float((per_sample * weights).sum().detach()) / max(batch.real, 1))
        if run.should_stop():                     # a preemption signal: save and leave
            run.save(api.torch_state(model, optimizer))
            break
        if run.checkpoint_due():
            run.save(api.torch_state(model, optimizer))

    else:
        run.save(api.torch_state(model, optimizer), reason="final")   # the loop ran to its end

    model.eval()
    with torch.no_grad():                         # each rank scores a share of the test set
        ids = np.arange(hvd.rank(), len(test), hvd.size())
        x, y = test[ids]
        correct = int((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).sum())
    correct = sum(hvd.allgather_object(correct))
    run.finish(params=api.torch_state(model)["model"], test_accuracy=correct / len(test))


if __name__ == "__main__":
    main()
