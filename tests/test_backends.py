"""Backend pieces that need no cluster: device choice, precision, model parity.

The GPU paths (device by local rank, float16 autocast with a grad scaler) are decided by the
pure functions tested here; they have not run on a GPU in CI (there is none)."""

import pytest

from hpcsuite.runtime.frameworks.torch_backend import autocast_settings, pick_device


@pytest.mark.parametrize("local_rank, cuda, count, device", [
    (0, False, 0, "cpu"), (3, False, 0, "cpu"), (0, True, 0, "cpu"),
    (0, True, 4, "cuda:0"), (3, True, 4, "cuda:3"), (5, True, 4, "cuda:1"),
])
def test_pick_device_by_local_rank(local_rank, cuda, count, device):
    assert pick_device(local_rank, cuda, count) == device


def test_autocast_settings():
    assert autocast_settings("fp32", "cpu") == (False, "cpu", None, False)
    assert autocast_settings("amp", "cpu") == (True, "cpu", "bfloat16", False)
    assert autocast_settings("amp", "cuda:1") == (True, "cuda", "float16", True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name, shape", [("mlp", (32,)), ("resnet", (3, 16, 16))])
def test_one_name_one_architecture_in_both_frameworks(name, shape):
    """Same parameter count, same output shape, in PyTorch and TensorFlow."""
    import subprocess
    import sys

    probe = f"""
import os, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, torch
from hpcsuite import models
x = np.zeros((2, *{shape!r}), np.float32)
t = models.build({name!r}, "torch", {shape!r}, 10)
k = models.build({name!r}, "tensorflow", {shape!r}, 10)
print(json.dumps([sum(p.numel() for p in t.parameters()), int(k.count_params()),
                  list(t(torch.from_numpy(x)).shape), list(k(x).shape)]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-2000:]
    import json
    torch_params, tf_params, torch_out, tf_out = json.loads(out.stdout.strip().splitlines()[-1])
    assert torch_params == tf_params > 0
    assert torch_out == tf_out == [2, 10]


def test_unknown_model_lists_the_known_ones():
    from hpcsuite import models
    from hpcsuite.errors import UserError

    with pytest.raises(UserError, match=r"unknown model 'resnt' \(did you mean \"resnet\"\?\)"):
        models.build("resnt", "torch", (3, 8, 8), 10)


@pytest.mark.timeout(180)
def test_the_session_votes_through_real_horovod_on_one_rank(tmp_path):
    """The torch backend and script mode's collectives (over horovod.torch) both carry the
    session's vote: a raised flag is agreed, the loss sum comes back, objects go round."""
    import subprocess
    import sys

    probe = f"""
import json
import horovod.torch as hvd
from hpcsuite.runtime.script.collectives import HorovodObjects
from hpcsuite.runtime.session.session import Session
from hpcsuite.runtime.rank.signals import StopFlag
from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
from hpcsuite.submit.spec import spec_from_dict

job = spec_from_dict({{"name": "v", "output_dir": {str(tmp_path)!r}, "train": {{"batch_size": 4}}}}, "t")
out = []
for ranks in (TorchBackend(job), HorovodObjects(hvd)):
    flag = StopFlag()
    flag.raise_("USR1")
    s = Session(job, {str(tmp_path)!r}, ranks, flag)
    s.post_vote(1, [0.1], 0, 0.25, loss_sum=2.5)
    v = s.read_vote()
    out.append([v.stop, v.loss_sum, s.stopped, ranks.broadcast_object({{"a": 1}}),
                ranks.allgather_object(3)])
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    import json
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[True, 2.5, True, {"a": 1}, [3]]] * 2


RESUMED = """
import hashlib, json, os, types
import torch, horovod.torch as hvd
from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
hvd.init()
torch.manual_seed(hvd.rank())                    # apart until rank 0's state reaches them
model = torch.nn.Linear(4, 3)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
if hvd.rank() == 0:                              # as after loading a checkpoint: a state
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
TorchBackend.broadcast_state(types.SimpleNamespace(hvd=hvd, model=model, optimizer=optimizer))
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
sums = hvd.allgather_object(h.hexdigest())
if hvd.rank() == 0:
    print(json.dumps(sums))
"""


@pytest.mark.timeout(180)
def test_a_resumed_optimizer_state_reaches_every_rank_without_moving_its_parameters(tmp_path):
    """After a resume only rank 0 holds the optimizer's state; Horovod gives the others one
    with a step on zero gradients, which under weight decay moves their parameters. Rank 0's
    parameters go out after it, so the ranks start equal (they trained apart before)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    pytest.importorskip("horovod.torch")
    (tmp_path / "resumed.py").write_text(RESUMED)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", "--mca", "pml", "ob1",
                           "--mca", "btl", "self,tcp", sys.executable, str(tmp_path / "resumed.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sums = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(sums) == 2 and sums[0] == sums[1], sums
