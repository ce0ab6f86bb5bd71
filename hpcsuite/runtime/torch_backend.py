"""PyTorch on horovod.torch: DistributedOptimizer, broadcast from rank 0, ring-allreduce."""

from __future__ import annotations

import hashlib
import signal

import numpy as np

from ..errors import UserError
from ..spec import JobSpec


def pick_device(local_rank: int, cuda_available: bool, device_count: int) -> str:
    """One GPU per rank, chosen by local rank; the CPU when there is no GPU."""
    if not cuda_available or device_count == 0:
        return "cpu"
    return f"cuda:{local_rank % device_count}"


def autocast_settings(precision: str, device: str) -> tuple[bool, str, object, bool]:
    """(enabled, device_type, dtype name, use grad scaler) for torch.autocast.

    ``amp`` means float16 with a gradient scaler on CUDA, bfloat16 (which needs no scaler)
    on the CPU."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if precision != "amp":
        return False, kind, None, False
    return True, kind, "float16" if kind == "cuda" else "bfloat16", kind == "cuda"


def _imports():
    try:
        import torch
        import horovod
        import horovod.torch as hvd
    except ImportError as e:
        raise UserError(f"hpcsuite train (backend torch) cannot import {e.name}: {e}; install "
                        "torch and Horovod on the compute nodes (scripts/setup.sh) or load the "
                        "site's modules in the profile") from None
    return torch, horovod, hvd


class _Batches:
    """torch Dataset over one epoch's micro-batches of the shared index stream."""

    def __init__(self, spec, seed, batches):
        self.spec, self.seed, self.batches = spec, seed, batches
        self._data = None

    def bind(self, data):
        self._data = data
        return self

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        import torch

        if self._data is None:               # in a DataLoader worker: open our own view
            from .data import open_data
            self._data = open_data(self.spec, self.seed)
        b = self.batches[i]
        x, y = self._data.get(b.ids)
        return i, torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(b.weights)

    def __getstate__(self):                  # workers re-open data instead of copying it
        return {"spec": self.spec, "seed": self.seed, "batches": self.batches, "_data": None}


class TorchBackend:
    name = "torch"

    def __init__(self, job: JobSpec):
        self.torch, self.horovod, self.hvd = _imports()
        self.job, self.t = job, job.train
        self.hvd.init()
        self.rank, self.size, self.local_rank = self.hvd.rank(), self.hvd.size(), self.hvd.local_rank()
        torch = self.torch
        self.device = pick_device(self.local_rank, torch.cuda.is_available(),
                                  torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        torch.set_num_threads(job.resources.cpus_per_task)
        torch.manual_seed(self.t.seed)

    def build(self, shape, classes) -> None:
        from hpcsuite import models

        torch, hvd = self.torch, self.hvd
        self.model = models.build(self.t.model, "torch", shape, classes).to(self.device)
        opt = torch.optim.SGD(self.model.parameters(), lr=self.t.lr, momentum=0.9)
        h = self.t.horovod
        self.optimizer = hvd.DistributedOptimizer(
            opt, named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if h.compression == "fp16" else hvd.Compression.none,
            op=hvd.Adasum if h.op == "adasum" else hvd.Average,
            backward_passes_per_step=self.t.grad_accumulation)
        enabled, kind, dtype, scaler = autocast_settings(self.t.precision, self.device)
        self.autocast = dict(device_type=kind, enabled=enabled,
                             dtype=getattr(torch, dtype) if dtype else None)
        self.scaler = torch.amp.GradScaler("cuda") if scaler else None
        self.loss_fn = torch.nn.CrossEntropyLoss(reduction="none")

    # ---------------------------------------------------------------- data
    def feed(self, data, batches):
        torch = self.torch
        d = self.t.data
        dataset = _Batches(d, self.t.seed, batches)
        if d.workers == 0:
            dataset.bind(data)
        cuda = self.device.startswith("cuda")
        if d.workers == 0 and not cuda:
            # In-process loading: the DataLoader machinery would only add per-batch cost.
            for i in range(len(dataset)):
                _, x, y, w = dataset[i]
                yield batches[i], x, y, w
            return
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, shuffle=False, num_workers=d.workers, pin_memory=cuda,
            prefetch_factor=d.prefetch if d.workers else None,
            # forkserver: forking a process that has initialised MPI is unsafe.
            multiprocessing_context="forkserver" if d.workers else None,
            persistent_workers=False)
        # Loader workers (and the forkserver that starts them) share the rank's process group,
        # and mpirun/srun deliver the preemption signal to the whole group: start them with
        # those signals blocked (the mask is inherited), so only this process acts on them.
        mask = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
        try:
            batches_iter = iter(loader)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for i, x, y, w in batches_iter:
            if cuda:
                x, y, w = (t.to(self.device, non_blocking=True) for t in (x, y, w))
            yield batches[i], x, y, w

    # ---------------------------------------------------------------- step
    def micro_step(self, x, y, w, scale, last):
        torch = self.torch
        with torch.autocast(**self.autocast):
            per_sample = self.loss_fn(self.model(x).float(), y) * w
        # Scaled so that Horovod's average over ranks is the mean over the step's real
        # samples: padded slots have weight 0 and never count.
        loss = per_sample.sum() * scale
        if self.scaler:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if last:
            if self.scaler:
                self.optimizer.synchronize()
                self.scaler.unscale_(self.optimizer)
                with self.optimizer.skip_synchronize():
                    self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad()
        return per_sample.detach().sum()

    def losses_to_floats(self, losses):
        return [float(v) for v in losses]

    # ---------------------------------------------------------------- state
    def state(self):
        model = {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
        sd = self.optimizer.state_dict()
        optim = {}
        for idx, entry in sd["state"].items():
            for key, value in entry.items():
                arr = value.detach().cpu().numpy() if self.torch.is_tensor(value) else np.asarray(value)
                optim[f"state.{idx}.{key}"] = arr
        groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
        extra = {"optimizer_param_groups": groups}
        if self.scaler:
            extra["grad_scaler"] = self.scaler.state_dict()
        return {"model": model, "optimizer": optim}, extra

    def load_state(self, tensors, extra):
        torch = self.torch
        model = {k: torch.from_numpy(np.array(v)) for k, v in tensors["model"].items()}
        self.model.load_state_dict(model, strict=True)
        state: dict = {}
        for name, arr in tensors.get("optimizer", {}).items():
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = torch.from_numpy(np.array(arr)).to(self.device)
        groups = extra.get("optimizer_param_groups") or self.optimizer.state_dict()["param_groups"]
        for g in groups:
            g["lr"] = self.t.lr            # the job spec's learning rate wins on resume
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        if self.scaler and "grad_scaler" in extra:
            self.scaler.load_state_dict(extra["grad_scaler"])

    def broadcast_state(self):
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def broadcast_object(self, obj):
        return self.hvd.broadcast_object(obj, root_rank=0, name="hpcsuite.object")

    def allgather_object(self, obj):
        return self.hvd.allgather_object(obj, name="hpcsuite.gather")

    def poll_start(self, values):
        t = self.torch.tensor(values, dtype=self.torch.int32)
        return self.hvd.allreduce_async(t, op=self.hvd.Max, name="hpcsuite.poll")

    def poll_result(self, handle):
        return [int(v) for v in self.hvd.synchronize(handle)]

    def checksum(self) -> str:
        h = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def versions(self) -> dict:
        from mpi4py import MPI

        return {"torch": self.torch.__version__, "horovod": self.horovod.__version__,
                "mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 "),
                "numpy": np.__version__, "cuda": self.torch.version.cuda}

    def shutdown(self):
        self.hvd.shutdown()
