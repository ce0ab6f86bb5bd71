"""PyTorch on horovod.torch: DistributedOptimizer, broadcast from rank 0, ring-allreduce."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from ...errors import UserError
from ...usercode import blame
from ...submit.spec import JobSpec, Optimizer
from .backend import HorovodBackend
from ..rank.startup import OFF
from ..input.blocks import Buffers, Ones, block_size, plan_blocks, read_block, reads_alone


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
                        "torch and Horovod on the compute nodes (hpcsuite-build-horovod) or load the "
                        "site's modules in the profile") from None
    return torch, horovod, hvd


def make_optimizer(torch, o: Optimizer, params, lr: float):
    """The torch optimizer train.optimizer names (its rate is set every step by the schedule)."""
    if o.name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=tuple(o.betas), eps=o.eps,
                                weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(o.betas), eps=o.eps,
                                 weight_decay=o.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)


class TorchBackend(HorovodBackend):
    name = "torch"

    def __init__(self, job: JobSpec, watch=OFF):
        self.torch, self.horovod, hvd = _imports()
        super().__init__(job, hvd, watch)
        torch = self.torch
        self.device = pick_device(self.local_rank, torch.cuda.is_available(),
                                  torch.cuda.device_count() if torch.cuda.is_available() else 0)
        self.on_cuda = self.device.startswith("cuda")
        if self.on_cuda:
            torch.cuda.set_device(self.device)
        self.waited = 0.0                    # seconds in the allreduce's wait (take_wait)
        # Adasum reduces the optimizer's deltas inside its step(), after the local update: no
        # wait to time apart (and its optimizer refuses skip_synchronize)
        h = job.train.horovod
        self.timed_wait = h.allreduce and h.op != "adasum"
        torch.set_num_threads(job.resources.cpus_per_task)
        torch.manual_seed(self.train.seed)

    def build(self, data) -> None:
        torch, hvd = self.torch, self.hvd
        self.check_loss_fits(data)
        self.classify = data.classes is not None
        self.model = self.make_model(data)
        if not isinstance(self.model, torch.nn.Module):
            raise UserError(f"train.model: {self.train.model} returned {type(self.model).__name__}, "
                            "not a torch.nn.Module (the job's backend is torch)")
        self.model = self.model.to(self.device)
        enabled, kind, dtype, scaler = autocast_settings(self.train.precision, self.device)
        self.autocast = dict(device_type=kind, enabled=enabled,
                             dtype=getattr(torch, dtype) if dtype else None)
        # Entering a disabled autocast context still costs every step: micro_step skips it.
        self.mixed = enabled
        self.scaler = torch.amp.GradScaler("cuda") if scaler else None
        self.user_loss_fn = self.user_loss()
        self._read_next = None               # set while _read_in_process feeds the loop
        self._input = None                   # on a GPU: the prefetch thread or resident data
        if self.device.startswith("cuda"):
            from ..input.prefetch import Input

            self._input = Input(torch, self.device, self.train.data.prefetch, self.train.data.on_device,
                                self.rank)
        self._buffers = Buffers()            # blocks are read into these, used again
        # weights of full micro-batches, by size: where the step runs, and in host memory for
        # in-process reads (blocks.Ones)
        self._full = Ones(lambda n: torch.ones(n, device=self.device))
        self._full_on_cpu = Ones(lambda n: torch.ones(n))
        self.plain_loss = self.user_loss_fn is None and self.train.loss == "cross_entropy"
        self._dry_run(data)
        # What the first training step's forward really computed in (read once, then the hook
        # is gone): the evidence in results.json that train.precision took effect.
        self._seen_dtype = None
        self._seen_hook = self.model.register_forward_hook(self._see_dtype)
        opt = make_optimizer(torch, self.train.optimizer, self.model.parameters(), self.train.lr)
        h = self.train.horovod
        if not h.allreduce:                  # the no-communication limit: no gradient allreduce
            self.optimizer = opt
            return
        self.optimizer = hvd.DistributedOptimizer(
            opt, named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if h.compression == "fp16" else hvd.Compression.none,
            op=hvd.Adasum if h.op == "adasum" else hvd.Average,
            backward_passes_per_step=self.train.grad_accumulation)

    def _dry_run(self, data) -> None:
        """Two samples through the model and the loss: a model or loss that does not fit the
        data fails here, in one line, not somewhere inside the first step."""
        torch = self.torch
        x, y = data.get(np.array([0, min(1, len(data) - 1)], dtype=np.int64))
        x, y = torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device)
        with torch.no_grad(), torch.autocast(**self.autocast):
            with blame("train.model", self.train.model):
                out = self.model(x)
            self.check_output(out.shape, len(x), data)
            with blame("train.loss", self.train.loss):
                loss = self.per_sample_loss(out.float(), y)
            self.check_per_sample(loss.shape, len(x))

    def per_sample_loss(self, out, y):
        torch = self.torch
        if self.user_loss_fn is not None:
            return self.user_loss_fn(out, y)
        if self.train.loss == "mse":
            return ((out.reshape(len(out), -1) - y.reshape(len(y), -1)) ** 2).mean(dim=1)
        return torch.nn.functional.cross_entropy(out, y, reduction="none")

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---------------------------------------------------------------- data
    def feed(self, data, batches):
        """(batch, (x, y, w)) for each micro-batch. On a GPU (:mod:`hpcsuite.runtime.input.prefetch`): gathered on the
        GPU from resident data, or with workers 0 gathered ahead by a thread and copied ahead
        on a side stream. With workers, read by the run's loader processes (:mod:`hpcsuite.runtime.input.workers`)."""
        d = self.train.data
        if self._input is not None:
            resident = self._input.resident(data)
            if resident is not None:
                yield from resident.feed(batches)
                return
            if d.workers == 0:
                yield from self._input.prefetcher.feed(data, batches)
                return
        if d.workers:
            yield from self._from_workers(data, batches)
            return
        # workers 0: read in this process, between the steps (:meth:`_read_in_process`).
        yield from self._read_in_process(data, batches)

    def _from_workers(self, data, batches):
        """The micro-batches read by the run's loader workers (:mod:`hpcsuite.runtime.input.workers`, started once),
        in blocks as in-process reads are, a view of the block per micro-batch."""
        if not batches:
            return
        torch = self.torch
        cuda = self.device.startswith("cuda")
        for group, xs, ys in self.from_workers(data, batches):
            xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
            if cuda:
                xs, ys = xs.to(self.device), ys.to(self.device)
            for b, x, y in zip(group, xs.unbind(0), ys.unbind(0)):
                yield b, (x, y, self._weights(b))

    def _weights(self, batch):
        """A micro-batch's weights on the device (one tensor of ones per size when full)."""
        size = len(batch.ids)
        if batch.real < size:
            return self.torch.from_numpy(batch.weights).to(self.device)
        return self._full(size)

    def _read_in_process(self, data, batches):
        """The micro-batches: mid-sized ones alone (:meth:`_read_alone`), the others in blocks
        (see :func:`hpcsuite.runtime.input.blocks.read_block`: one dataset call and one tensor per field for a block,
        a view of it per micro-batch). The next block is read when free: micro_step asks for it
        after the backward pass has handed the gradients to Horovod and before the optimizer
        waits for their allreduce. Blocks are read into arrays used again once the previous
        steps' tensors are gone (:class:`hpcsuite.runtime.input.blocks.Buffers`)."""
        if not batches:
            return
        from_numpy = self.torch.from_numpy
        if reads_alone(data, len(batches[0].ids)):
            yield from self._read_alone(data, batches)
            return
        groups = iter(plan_blocks(batches, block_size(data, len(batches[0].ids))))
        ready: list = []                     # the block's micro-batches not handed out, last first

        def read_next():
            if not ready:
                group = next(groups, None)
                if group is not None:
                    block = read_block(data, group, self._buffers)
                    views = zip(*(from_numpy(a).unbind(0) for a in (block.x, block.y, block.w)))
                    ready.extend(reversed(list(zip(group, views))))

        self._read_next = read_next
        try:
            while True:
                read_next()                  # unless micro_step has read it already
                if not ready:
                    return
                yield ready.pop()
        finally:
            if self._read_next is read_next:
                self._read_next = None

    def _read_alone(self, data, batches):
        """Mid-sized micro-batches (:func:`hpcsuite.runtime.input.blocks.reads_alone`), each read by itself into a
        new array at the start of its step, as a plain loop reads them."""
        from_numpy = self.torch.from_numpy
        for batch in batches:
            x, y = data.get(batch.ids)
            size = len(batch.ids)
            w = from_numpy(batch.weights) if batch.real < size else self._full_on_cpu(size)
            yield batch, (from_numpy(x), from_numpy(y), w)

    # ---------------------------------------------------------------- step
    def micro_step(self, inputs, scale, last, padded=True):
        """One micro-batch forward and backward (and the optimizer step after the last one).
        Returns (tensor, factor): the micro-batch's loss sum is float(tensor) * factor."""
        torch = self.torch
        x, y, w = inputs
        if self.mixed:
            with torch.autocast(**self.autocast):
                out = self.model(x).float()
        else:                                # every step: no context, no cast of float32
            out = self.model(x)
            if out.dtype is not torch.float32:
                out = out.float()
        # The loss is scaled so that Horovod's average over ranks is the mean over the step's
        # real samples: padded slots have weight 0 and never count.
        if not padded and self.plain_loss and abs(scale * len(y) - 1.0) < 1e-9:
            # A full, unpadded step: that scaled sum is the plain mean, one op.
            loss = torch.nn.functional.cross_entropy(out, y)
            result = (loss.detach(), float(len(y)))
        else:
            loss_sum = (self.per_sample_loss(out, y) * w).sum()
            loss = loss_sum * scale
            result = (loss_sum.detach(), 1.0)
        if self.scaler:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if last:
            if self._read_next is not None:
                self._read_next()            # while Horovod reduces this step's gradients
            self.synchronize()
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
                with self.optimizer.skip_synchronize():
                    self.scaler.step(self.optimizer)
                self.scaler.update()
            elif self.timed_wait:
                with self.optimizer.skip_synchronize():
                    self.optimizer.step()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad()
        return result

    def synchronize(self) -> None:
        """Wait for this step's gradient allreduces, timed: the wait for the other ranks (and
        the transfer), apart from this rank's own work (:mod:`hpcsuite.runs.stragglers`). On a
        GPU the compute stream is drained first, so the wait starts when this rank's backward
        is done, not when its kernels were queued."""
        if not self.timed_wait:
            return
        if self.on_cuda:
            self.torch.cuda.current_stream().synchronize()
        t0 = time.perf_counter()
        self.optimizer.synchronize()
        self.waited += time.perf_counter() - t0

    def take_wait(self) -> float | None:
        """Seconds spent waiting in the allreduce since the last call (and reset)."""
        waited, self.waited = self.waited, 0.0
        return waited if self.timed_wait else None

    def losses_to_floats(self, losses):
        # One stack and one read for many steps (a device sync each on a GPU), the values exactly.
        if not losses:
            return []
        values = self.torch.stack([t for t, _ in losses]).tolist()
        return [v * factor for v, (_, factor) in zip(values, losses)]

    def eval_step(self, inputs) -> tuple[float, float]:
        """(sum of weighted losses, weighted count of correct predictions) for one batch."""
        torch = self.torch
        x, y, w = inputs
        self.model.eval()
        try:
            with torch.no_grad(), torch.autocast(**self.autocast):
                out = self.model(x).float()
                loss = float((self.per_sample_loss(out, y) * w).sum())
                correct = float(((out.argmax(dim=1) == y).float() * w).sum()) if self.classify else 0.0
        finally:
            self.model.train()
        return loss, correct

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
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        if self.scaler and "grad_scaler" in extra:
            self.scaler.load_state_dict(extra["grad_scaler"])

    def broadcast_state(self):
        # The optimizer's state first: on a rank whose optimizer has no state yet (every rank
        # but 0 after a resume) Horovod initialises it with one step on zero gradients, and
        # under weight decay (AdamW, SGD's weight_decay) that step moves the parameters. Rank
        # 0's parameters, sent after, undo it; sent before, the ranks trained apart from then on.
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def vote_start(self, values):
        t = self.torch.tensor(values, dtype=self.torch.int32)
        return self.hvd.allreduce_async(t, op=self.hvd.Max, name="hpcsuite.poll")

    def vote_result(self, handle):
        return [int(v) for v in self.hvd.synchronize(handle)]

    def allreduce_sums(self, values: list[float]) -> list[float]:
        t = self.torch.tensor(values, dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Sum, name="hpcsuite.sums").tolist()

    def gradient_sizes(self) -> list[int]:
        """Elements of each gradient the allreduce carries (the trainable parameters)."""
        return [p.numel() for p in self.model.parameters() if p.requires_grad]

    def _see_dtype(self, module, args, output) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        if module.training and hasattr(out, "dtype"):
            self._seen_dtype = str(out.dtype).removeprefix("torch.")
            self._seen_hook.remove()

    def precision_seen(self) -> dict:
        return {"compute_dtype": self._seen_dtype, "loss_scaling": self.scaler is not None,
                "param_dtype": str(next(self.model.parameters()).dtype).removeprefix("torch.")}

    def checksum(self) -> str:
        h = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def versions(self) -> dict:
        return {**self.common_versions(), "torch": self.torch.__version__,
                "cuda": self.torch.version.cuda}
