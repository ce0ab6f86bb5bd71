"""The GPU path of the backends, run wherever a CUDA GPU is present: each test is skipped with
the reason printed (pytest -rs) on a machine without one, such as the project's 2-core CI
machine. GPU placement itself (Slurm gres, CUDA_VISIBLE_DEVICES per rank) needs no GPU and
is tested in tests/test_gpu_placement.py and tests/test_e2e_gpu.py. None of these needs Slurm:
bench/gpu_check.sh runs them on a lent GPU machine, which has none."""

import importlib.util
import json
import subprocess
import sys

import math

import pytest
from rank_by_hand import run_rank, write_job

from hpcsuite.runs.results import Results


def _cuda() -> bool:
    probe = "import torch; print(torch.cuda.is_available() and torch.cuda.device_count())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    return done.returncode == 0 and done.stdout.strip() not in ("", "False", "0")


needs_gpu = pytest.mark.skipif(not _cuda(), reason="no CUDA GPU here (torch.cuda.is_available() "
                               "is False): the backends' GPU path was not run")


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_gpu
def test_the_torch_backend_trains_on_its_local_ranks_gpu_with_amp(tmp_path):
    """One rank: the backend picks cuda:0 (the one device placement leaves visible), AMP is
    float16 with a gradient scaler, and a few steps give a finite, falling loss."""
    out = _run(f"""
import json, os
os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
from hpcsuite.runtime.session.loop import Trainer
from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
from hpcsuite.submit.spec import spec_from_dict
job = spec_from_dict({{"name": "gpu", "output_dir": {str(tmp_path)!r}, "train": {{
    "precision": "amp", "max_steps": 30, "batch_size": 64, "data": {{"samples": 2048}}}}}}, "t")
backend = TorchBackend(job)
per_rank, results = Trainer(job, {str(tmp_path)!r}, backend).run()
print(json.dumps({{"device": backend.device, "scaler": backend.scaler is not None,
                  "first": results.loss[0], "last": results.loss[-1]}}))
""")
    assert out["device"] == "cuda:0" and out["scaler"]
    assert out["last"] < out["first"]


@needs_gpu
def test_horovod_was_built_with_nccl_where_cuda_exists():
    out = _run("import json, horovod.torch as hvd; hvd.init(); "
               "print(json.dumps({'nccl': hvd.nccl_built(), 'cuda': hvd.cuda_built()}))")
    # nccl_built() is NCCL's version as an int (2.28.3: 22803), 0 without NCCL; cuda_built() a bool
    assert out["cuda"] is True and isinstance(out["nccl"], int) and out["nccl"] >= 20000, (
        out, "scripts/setup.sh builds Horovod with HOROVOD_GPU_OPERATIONS=NCCL when nvcc exists")


@needs_gpu
def test_an_allreduce_on_the_gpu_through_horovod():
    out = _run("import json, torch, horovod.torch as hvd; hvd.init(); "
               "t = torch.ones(1024, device='cuda') * (hvd.rank() + 1); "
               "r = hvd.allreduce(t, op=hvd.Sum); "
               "print(json.dumps({'device': str(r.device), 'value': float(r[0])}))")
    assert out == {"device": "cuda:0", "value": 1.0}


@needs_gpu
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="no TensorFlow here: the TensorFlow backend's GPU path was not run")
def test_tensorflow_uses_the_gpu_with_mixed_float16(tmp_path):
    out = _run(f"""
import json
from hpcsuite.runtime.session.loop import Trainer
from hpcsuite.runtime.frameworks.tf_backend import TensorFlowBackend
from hpcsuite.submit.spec import spec_from_dict
job = spec_from_dict({{"name": "gpu", "output_dir": {str(tmp_path)!r}, "train": {{
    "backend": "tensorflow", "precision": "mixed_float16", "max_steps": 20, "batch_size": 64,
    "data": {{"samples": 2048}}}}}}, "t")
backend = TensorFlowBackend(job)
per_rank, results = Trainer(job, {str(tmp_path)!r}, backend).run()
print(json.dumps({{"device": backend.device, "last": results.loss[-1]}}))
""")
    assert out["device"].startswith("cuda:") and out["last"] == out["last"]   # finite, not NaN


@needs_gpu
def test_a_rank_trains_on_the_gpu_with_amp_monitored_then_resumes(tmp_path):
    """`hpcsuite train` as a rank runs it (a subprocess reading its job.json; no Slurm, as on a
    lent GPU machine): amp, the monitor, checkpoints; then a second attempt resumes from the
    last checkpoint. amp is float16 with a gradient scaler only on a CUDA device (bfloat16
    without one on the CPU), so precision_seen says where the steps ran; the monitor's NVML
    samples say which GPU was busy."""
    spec = {"name": "gpu-rank", "output_dir": str(tmp_path / "runs"), "train": {
        "model": "resnet", "precision": "amp", "max_steps": 30, "batch_size": 64,
        "data": {"samples": 4096, "shape": [3, 32, 32]},
        "monitor": {"enabled": True, "interval_seconds": 0.2},
        "checkpoint": {"every_steps": 10}}}
    first = write_job(tmp_path / "runs" / "gpu-rank" / "1", spec)
    done = run_rank(first)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    r = Results.load(first.parent / "results.json")
    assert r.precision_seen == {"compute_dtype": "float16", "loss_scaling": True,
                                "param_dtype": "float32"}, r.precision_seen
    assert r.versions.get("cuda"), r.versions
    gpu = [s for s in r.utilisation[0] if "gpu_percent" in s]
    assert gpu and all(s["gpu_memory_bytes"] > 0 for s in gpu), r.utilisation
    # NVML's energy counter (Volta and newer): the GPU's joules over training (issue V, point 6)
    assert r.energy_j and r.energy_j > 0 and len(r.energy_j_per_rank) == 1, r.energy_j_per_rank
    assert r.samples_per_joule == pytest.approx(r.samples / r.energy_j)
    assert [c["step"] for c in r.checkpoints] == [10, 20, 30]
    assert all(math.isfinite(x) for x in r.loss), r.loss
    assert sum(r.loss[-5:]) < sum(r.loss[:5]), r.loss                  # falling

    spec["train"]["max_steps"] = 40
    second = write_job(tmp_path / "runs" / "gpu-rank" / "2", spec)
    done = run_rank(second)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    r2 = Results.load(second.parent / "results.json")
    assert (r2.start_step, r2.final_step, r2.steps) == (30, 40, 10), r2
    assert r2.resumed_from and r2.precision_seen["compute_dtype"] == "float16"
    assert all(math.isfinite(x) for x in r2.loss)
