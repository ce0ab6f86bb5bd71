"""The torch backend's input on a GPU: host work off the training thread and the copy one step
ahead (:class:`Prefetcher`), or the whole data set on the GPU (:class:`Resident`).

The shape is the classic one (apex's ``data_prefetcher``, PyTorch's pin-memory thread):

- a background thread gathers the next micro-batches (``data.get``) straight into a ring of
  ``depth`` pinned host slots (``train.data.prefetch``): it never runs further ahead than
  ``depth`` micro-batches beyond the one on its way to the GPU, so the pinned memory is
  ``depth`` micro-batches, stated in the log when the pipeline starts; on the GPU, beyond the
  model's memory, the micro-batch in use and the next one;
- the training thread copies the next micro-batch host→device on a side CUDA stream as it hands
  out the current one, so the copy runs under the current step's kernels; the compute stream
  ``wait_stream``s the side stream before it reads the batch, and each tensor handed over is
  ``record_stream``ed on it, so the allocator never reuses its memory while a step may read it;
- a slot goes back to the thread with an event recorded after its copy; the thread waits on
  that event before it writes the slot again.

Nothing here moves the data cursor: the loop advances it for micro-batches it trained, so
batches still queued or in flight when the loop stops are simply dropped and read again by
the attempt that resumes (exactly once). Closing the generator stops and joins the thread.

On a device other than CUDA (the unit tests' stand-in) the same thread, queue and slot ring run
without pinning, streams or events, the "copy" being a clone.

``train.data.on_device``: ``auto`` puts the data on the GPU when its bytes are at most
RESIDENT_SHARE of the GPU's free memory (and keeps it on the host, prefetched, when the copy
runs out of memory all the same), ``true`` always, ``false`` never. Resident data is read
once (in chunks through the source's ``get``); each epoch's micro-batch ids go to the GPU in one
copy, and the micro-batches are gathered there (``index_select``, up to GATHER_STEPS of them in
one), no host work per step.
"""

from __future__ import annotations

import logging
import queue
import threading

import numpy as np

from ...errors import UserError
from .blocks import Ones

log = logging.getLogger(__name__)

# auto: the data goes on the GPU when it takes at most this share of the memory free there
# once the model is built; the rest is left to activations, the optimizer and the allocator.
RESIDENT_SHARE = 0.25
RESIDENT_CHUNK_BYTES = 64 << 20   # read and copied to the GPU this much at a time
GATHER_BYTES = 32 << 20           # resident data: micro-batches gathered together, at most
GATHER_STEPS = 16                 # this many bytes and micro-batches at a time


def sample_bytes(data) -> tuple[int, int]:
    """(input bytes, target bytes) of one sample as the backends hold it (float32 inputs,
    int64 labels or float32 targets)."""
    x = 4 * int(np.prod(data.shape, dtype=np.int64))
    y = 8 if data.classes is not None else 4 * int(np.prod(data.target_shape or (1,), dtype=np.int64))
    return x, y


def data_bytes(data) -> int:
    return len(data) * sum(sample_bytes(data))


def _label_dtype(torch, data):
    return torch.int64 if data.classes is not None else torch.float32


class _Slot:
    """Host tensors one micro-batch is gathered into (pinned on CUDA) and their numpy views;
    ``copied``: an event recorded after the last copy out of them (None before the first)."""
    __slots__ = ("size", "x", "y", "w", "xn", "yn", "wn", "copied", "event")


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetcher:
    """Micro-batches gathered ahead on a thread and copied ahead on a side stream."""

    def __init__(self, torch, device: str, depth: int, rank: int = 0):
        self.torch, self.device, self.depth, self.rank = torch, device, max(1, depth), rank
        self.cuda = device.startswith("cuda")
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self._rings: dict[tuple, list[_Slot]] = {}
        self._full = Ones(lambda n: torch.ones(n, device=device))   # full micro-batches' weights
        self.queued = 0                      # micro-batches gathered and not yet handed out

    # ---------------------------------------------------------------- slots
    def _ring(self, data, size: int) -> list[_Slot]:
        """The ``depth`` slots for micro-batches of ``size`` samples of ``data`` (made once,
        used for every epoch)."""
        key = (size, tuple(data.shape), tuple(getattr(data, "target_shape", ())),
               data.classes is not None)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = [self._slot(size, data) for _ in range(self.depth)]
            x, y = sample_bytes(data)
            if self.rank == 0:
                log.info("input: up to %d micro-batches gathered ahead by a thread into %s"
                         "slots of %.1f MB (%.1f MB in all)%s", len(ring),
                         "pinned " if self.cuda else "", size * (x + y + 4) / 1e6,
                         len(ring) * size * (x + y + 4) / 1e6,
                         ", copied to the GPU one step ahead on a side stream" if self.cuda else "")
        return ring

    def _slot(self, size: int, data) -> _Slot:
        torch, pin = self.torch, self.cuda
        s = _Slot()
        s.size = size
        s.x = torch.empty((size, *data.shape), dtype=torch.float32, pin_memory=pin)
        s.y = torch.empty((size, *getattr(data, "target_shape", ())), dtype=_label_dtype(torch, data),
                          pin_memory=pin)
        s.w = torch.empty(size, dtype=torch.float32, pin_memory=pin)
        s.xn, s.yn, s.wn = s.x.numpy(), s.y.numpy(), s.w.numpy()
        s.copied = None
        s.event = torch.cuda.Event() if self.cuda else None
        return s

    # ---------------------------------------------------------------- the thread
    def _gather(self, data, batches, free, filled, stop) -> None:
        """The background thread: each micro-batch into a free slot, in order."""
        reads_into = getattr(data, "reads_into", False)
        try:
            for i, batch in enumerate(batches):
                slot = free.get()
                if slot is None or stop.is_set():
                    return
                if slot.copied is not None:
                    slot.copied.synchronize()        # the copy out of it has finished
                n = len(batch.ids)
                x, y = slot.xn[:n], slot.yn[:n]
                if reads_into:
                    data.get(batch.ids, (x, y))
                else:
                    gx, gy = data.get(batch.ids)
                    x[...], y[...] = gx, gy
                if batch.real < n:
                    slot.wn[:n] = batch.weights
                filled.put((i, slot))
            filled.put(_END)
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
            filled.put(_Failed(e))

    # ---------------------------------------------------------------- the training thread
    def feed(self, data, batches):
        """(batch, (x, y, w)) on the device for each micro-batch, in order."""
        if not batches:
            return
        ring = self._ring(data, max(len(b.ids) for b in batches))
        free, filled, stop = queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
        for slot in ring:
            free.put(slot)
        thread = threading.Thread(target=self._gather, args=(data, batches, free, filled, stop),
                                  name="hpcsuite-prefetch", daemon=True)
        thread.start()
        try:
            yield from self._hand_over(batches, free, filled)
        finally:
            stop.set()
            free.put(None)                           # wakes the thread if it waits for a slot
            thread.join()
            if self.cuda:
                self.stream.synchronize()            # no copy in flight from a slot used next

    def _hand_over(self, batches, free, filled):
        current = self.current = self.torch.cuda.current_stream(self.device) if self.cuda else None
        nxt = self._copy(batches, free, filled)
        while nxt is not None:
            batch, tensors, fresh = nxt
            if self.cuda:
                current.wait_stream(self.stream)     # its copy is done before a kernel reads it
                for t in fresh:
                    t.record_stream(current)         # its memory is not reused while in use
            nxt = self._copy(batches, free, filled)  # the next copy runs under this step
            yield batch, tensors

    def _copy(self, batches, free, filled):
        """The next gathered micro-batch copied to the device (issued on the side stream), its
        slot handed back to the thread; None at the end."""
        item = filled.get()
        if item is _END:
            return None
        if isinstance(item, _Failed):
            raise item.error
        i, slot = item
        self.queued = filled.qsize()                 # gathered, not yet handed out
        batch = batches[i]
        n = len(batch.ids)
        padded = batch.real < n
        hx, hy, hw = (slot.x, slot.y, slot.w) if n == slot.size else \
            (slot.x[:n], slot.y[:n], slot.w[:n])
        if self.cuda:
            # set_stream, not the torch.cuda.stream() context: the same, for less per step.
            set_stream, device = self.torch.cuda.set_stream, self.device
            set_stream(self.stream)
            try:
                x = hx.to(device, non_blocking=True)
                y = hy.to(device, non_blocking=True)
                w = hw.to(device, non_blocking=True) if padded else None
                slot.event.record(self.stream)
            finally:
                set_stream(self.current)
            slot.copied = slot.event
            fresh = (x, y) if w is None else (x, y, w)
            if w is None:
                w = self._full(n)
        else:
            x, y, w = hx.clone(), hy.clone(), hw.clone() if padded else self._full(n)
            fresh = ()
        free.put(slot)
        return batch, (x, y, w), fresh


class Resident:
    """``data`` copied to the device once; micro-batches gathered there."""

    def __init__(self, torch, device: str, data):
        self.torch, self.device, self.data = torch, device, data
        n = len(data)
        self.x = torch.empty((n, *data.shape), dtype=torch.float32, device=device)
        self.y = torch.empty((n, *getattr(data, "target_shape", ())),
                             dtype=_label_dtype(torch, data), device=device)
        chunk = max(1, RESIDENT_CHUNK_BYTES // max(1, sum(sample_bytes(data))))
        for start in range(0, n, chunk):
            ids = np.arange(start, min(start + chunk, n), dtype=np.int64)
            x, y = data.get(ids)
            end = start + len(ids)
            self.x[start:end].copy_(torch.from_numpy(np.ascontiguousarray(x, np.float32)))
            self.y[start:end].copy_(torch.from_numpy(np.ascontiguousarray(y)))
        self._full = Ones(lambda n: torch.ones(n, device=device))   # full micro-batches' weights

    def _to_device(self, array: np.ndarray):
        t = self.torch.from_numpy(array)
        if self.device.startswith("cuda"):
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def feed(self, batches):
        """(batch, (x, y, w)) gathered on the device: the epoch's ids (and any padding's
        weights) go there in one copy each."""
        if not batches:
            return
        torch = self.torch
        size = len(batches[0].ids)
        if any(len(b.ids) != size for b in batches):     # never from the sharder; still right
            for b in batches:
                yield from Resident.feed(self, [b])
            return
        rows = self._to_device(np.stack([b.ids for b in batches]))   # [micro-batch, id]
        weights = [self._full(size)] * len(batches)
        padded = [i for i, b in enumerate(batches) if b.real < size]
        if padded:
            on_device = self._to_device(np.stack([batches[i].weights for i in padded])).unbind(0)
            for i, w in zip(padded, on_device):
                weights[i] = w
        # Several micro-batches gathered by one index_select each (GATHER_BYTES at most): a
        # small model's step is short enough that two kernel launches per step show.
        per = max(1, min(GATHER_STEPS, GATHER_BYTES // max(1, size * sum(sample_bytes(self.data)))))
        x_all, y_all = self.x, self.y
        for start in range(0, len(batches), per):
            ids = rows[start:start + per].reshape(-1)            # a view: no copy
            xs = x_all.index_select(0, ids).split(size)
            ys = y_all.index_select(0, ids).split(size)
            for k, (x, y) in enumerate(zip(xs, ys)):
                yield batches[start + k], (x, y, weights[start + k])


class Input:
    """Which of the two a micro-batch comes through, decided once per data source."""

    def __init__(self, torch, device: str, depth: int, on_device, rank: int = 0,
                 free_memory=None):
        self.torch, self.device, self.on_device, self.rank = torch, device, on_device, rank
        self.prefetcher = Prefetcher(torch, device, depth, rank)
        self._free = free_memory or (lambda: torch.cuda.mem_get_info(device)[0])
        self._resident: dict[int, tuple[object, Resident | None]] = {}

    def resident(self, data) -> Resident | None:
        """``data`` on the device, if train.data.on_device puts it there (decided once)."""
        known = self._resident.get(id(data))
        if known is not None and known[0] is data:
            return known[1]
        got = self._place(data)
        self._resident[id(data)] = (data, got)
        return got

    def _place(self, data) -> Resident | None:
        if self.on_device is False:
            return None
        need, free = data_bytes(data), self._free()
        fits = need <= RESIDENT_SHARE * free
        if self.on_device == "auto" and not fits:
            if self.rank == 0:
                log.info("input: the data (%.1f MB) stays on the host: more than %d %% of the "
                         "GPU's %.1f MB free (train.data.on_device: auto)", need / 1e6,
                         100 * RESIDENT_SHARE, free / 1e6)
            return None
        try:
            got = Resident(self.torch, self.device, data)
        except self.torch.OutOfMemoryError as e:
            if self.on_device is True:
                raise UserError(f"train.data.on_device: true, but the data's {need / 1e6:.1f} MB "
                                f"do not fit on {self.device} ({free / 1e6:.1f} MB free); set it "
                                "to auto or false") from None
            # auto measured the free memory, then the copy ran out of it (another process
            # took it meanwhile, or the allocator's fragments): the host's pipeline instead.
            # What the copy had allocated goes back to the allocator with the exception.
            said = ". ".join(str(e).split(". ")[:2]).strip().rstrip(".")
            log.warning("input: rank %d: copying the data (%.1f MB) to %s ran out of GPU memory "
                        "(%s); it stays on the host and each micro-batch is prefetched "
                        "(train.data.on_device: auto; set false to skip the try)", self.rank,
                        need / 1e6, self.device, said)
            return None
        if self.rank == 0:
            log.info("input: the data (%.1f MB, %.0f %% of the %.1f MB free) copied to %s once; "
                     "each step's batch is gathered there", need / 1e6, 100 * need / max(free, 1),
                     free / 1e6, self.device)
        return got
