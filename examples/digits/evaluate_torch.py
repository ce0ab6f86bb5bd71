"""Evaluate what another job trained: the second link of a chain (train -> evaluate).

    cd examples/digits
    hpcsuite submit digits-script-torch.yaml            # trains; prints its job id
    hpcsuite submit digits-eval-torch.yaml --wait       # `after: [digits-script-torch]`: Slurm
                                                        # starts it once that job completed

The spec's ``after`` names the training job (its latest run from this directory); hpcsuite
turns it into sbatch --dependency=afterok:JOBID. This script loads the newest good checkpoint
the training job saved (api.load_checkpoint: read only, every rank reads it), scores the test
part on every rank's share and records the accuracy, and the step it was trained to, in its
own results.json.
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
    parser.add_argument("--checkpoints", required=True,
                        help="the training job's train.checkpoint.dir")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    run = api.Run(hvd)
    trained = api.load_checkpoint(args.checkpoints)
    model = build((64,), 10)
    api.load_torch_state(model, None, trained.state)
    model.eval()
    test = digits("test")
    with torch.no_grad():                         # each rank scores a share of the test set
        ids = np.arange(hvd.rank(), len(test), hvd.size())
        x, y = test[ids]
        correct = int((model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).sum())
    correct = sum(hvd.allgather_object(correct))
    run.finish(test_accuracy=correct / len(test), trained_step=trained.step,
               checkpoint=trained.path)


if __name__ == "__main__":
    main()
