"""Script mode, PyTorch: your own Horovod training loop, with hpcsuite's sharding, checkpoints,
preemption and results (see hpcsuite.api).

    cd examples/digits && hpcsuite submit digits-script-torch.yaml --wait

hpcsuite launches this file on every rank (`train.script`), with `train.args` as its arguments.
The same file runs by hand on one process too: `python train_torch.py`.
"""

import argparse

import horovod.torch as hvd
import numpy as np
import torch

from data import digits
from hpcsuite import api
from model import build


def numpy_state(module) -> dict:
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def optimizer_arrays(optimizer) -> dict:
    """The optimizer's state (moments, step counts) as named numpy arrays for run.save()."""
    out = {}
    for idx, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            out[f"{idx}.{key}"] = value.cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
    return out


def load_optimizer_arrays(optimizer, arrays: dict) -> None:
    state: dict = {}
    for name, value in arrays.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = torch.from_numpy(np.array(value))
    optimizer.load_state_dict({"state": state,
                               "param_groups": optimizer.state_dict()["param_groups"]})


def checkpoint(model, optimizer) -> dict:
    return {"model": numpy_state(model), "optimizer": optimizer_arrays(optimizer)}


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
        model.load_state_dict({k: torch.from_numpy(v) for k, v in restored.state["model"].items()})
        load_optimizer_arrays(optimizer, restored.state.get("optimizer", {}))
    else:                                         # a fresh start: rank 0's weights everywhere
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

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
            run.save(checkpoint(model, optimizer))
            break
        if run.checkpoint_due():
            run.save(checkpoint(model, optimizer))

    else:
        run.save(checkpoint(model, optimizer), reason="final")   # the loop ran to its end

    model.eval()
    with torch.no_grad():                         # each rank scores a share of the test set
        ids = np.arange(hvd.rank(), len(test), hvd.size())
        x, y = test[ids]
        correct = int((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).sum())
    correct = sum(hvd.allgather_object(correct))
    run.finish(params=numpy_state(model), test_accuracy=correct / len(test))


if __name__ == "__main__":
    main()
