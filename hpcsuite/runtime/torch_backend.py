"""PyTorch on horovod.torch: DistributedOptimizer, broadcast from rank 0, ring-allreduce."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..spec import JobSpec
from .data import open_data
from .sharding import Cursor, Sharder


def param_checksum(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _imports():
    try:
        import torch
        import horovod
        import horovod.torch as hvd
        from mpi4py import MPI
    except ImportError as e:
        raise UserError(f"hpcsuite train (backend torch) cannot import {e.name}: {e}; "
                        "install torch, mpi4py and Horovod on the compute nodes "
                        "(scripts/setup.sh) or load the site's modules in the profile's setup") from None
    return torch, horovod, hvd, MPI


def train(job: JobSpec, run_dir: Path) -> dict:
    torch, horovod, hvd, MPI = _imports()
    from hpcsuite import models

    t = job.train
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(job.resources.cpus_per_task)
    torch.manual_seed(t.seed)

    data = open_data(t.data, t.seed)
    model = models.build(t.model, "torch", data.features, data.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=0.9)
    compression = hvd.Compression.fp16 if t.horovod.compression == "fp16" else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=t.grad_accumulation)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    sharder = Sharder(len(data), size, rank, t.batch_size, t.seed, t.grad_accumulation)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    step_times: list[float] = []
    data_times: list[float] = []
    loss_sums: list[float] = []     # this rank's weighted loss sum per optimizer step
    real_counts: list[int] = []     # real samples per step across all ranks
    seen = 0
    step = 0
    t_start = time.perf_counter()
    for epoch in range(t.epochs):
        cursor = Cursor(epoch, 0)
        t0 = time.perf_counter()
        data_time = 0.0
        loss_sum = 0.0
        for batch in sharder.epoch(cursor):
            d0 = time.perf_counter()
            x, y = data.get(batch.ids)
            xb, yb = torch.from_numpy(x), torch.from_numpy(y)
            w = torch.from_numpy(batch.weights)
            data_time += time.perf_counter() - d0
            # Scaled so that allreduce's average over ranks is the mean over the step's
            # real samples: padding has weight 0 and never counts.
            per_sample = loss_fn(model(xb), yb) * w
            loss = per_sample.sum() * (size / batch.step_real)
            loss.backward()
            loss_sum += float(per_sample.detach().sum())
            seen += int(batch.weights.sum())
            if not batch.last_in_step:
                continue
            optimizer.step()
            optimizer.zero_grad()
            step_times.append(time.perf_counter() - t0)
            data_times.append(data_time)
            loss_sums.append(loss_sum)
            real_counts.append(batch.step_real)
            step += 1
            t0 = time.perf_counter()
            data_time, loss_sum = 0.0, 0.0
            if t.max_steps and step >= t.max_steps:
                break
        if t.max_steps and step >= t.max_steps:
            break
    elapsed = time.perf_counter() - t_start

    checksum = param_checksum(model)
    # One collective at the end instead of one per step: global loss per step from every
    # rank's sums, so metrics cost the training loop nothing.
    all_sums = hvd.allgather_object(loss_sums)
    checksums = hvd.allgather_object(checksum)
    hosts = hvd.allgather_object(_host())
    seen_all = hvd.allgather_object(seen)
    elapsed_max = max(hvd.allgather_object(elapsed))
    per_rank = {"rank": rank, "host": _host(), "steps": step, "samples": seen,
                "elapsed_s": elapsed, "step_time_s": step_times, "data_time_s": data_times,
                "param_checksum": checksum}
    results = None
    if rank == 0:
        from .train import step_stats

        loss = [float(sum(col) / n) for col, n in zip(zip(*all_sums), real_counts)]
        total = sum(seen_all)
        results = {
            "job": job.name, "backend": "torch", "model": t.model, "world_size": size,
            "hosts": hosts, "steps": step, "epochs": t.epochs, "batch_size_per_rank": t.batch_size,
            "samples": total, "elapsed_s": elapsed_max,
            "samples_per_s": total / elapsed_max if elapsed_max else 0.0,
            "samples_per_s_per_rank": [s / elapsed_max for s in seen_all],
            "step_time_s": step_stats(step_times), "step_times_s": step_times,
            "data_wait_fraction": sum(data_times) / max(sum(step_times), 1e-12),
            "loss": loss, "param_checksums": checksums, "spec_digest": job.digest(),
            "versions": {"torch": torch.__version__, "horovod": horovod.__version__,
                         "mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 "),
                         "numpy": np.__version__},
        }
    hvd.shutdown()
    return {"rank": rank, "per_rank": per_rank, "results": results}


def _host() -> str:
    from .train import hostname
    return hostname()
