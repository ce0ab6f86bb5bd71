"""Loader worker processes kept for the whole run (``train.data.workers > 0``).

A rank starts its workers the first time it reads through them and feeds them every epoch's
(and every validation pass's) blocks of micro-batches (:func:`.blocks.plan_blocks`): an epoch
boundary costs a refill of their queues, not the seconds of starting processes (before, every
epoch started its own DataLoader workers, each importing torch again). Framework-free: a
worker imports numpy and the data source only.

Block j goes to worker j mod W, into that worker's slot (j div W) mod D of shared memory, D =
``train.data.prefetch``; the rank copies the block out of the slot and only then hands the slot
the block D*W further on. So at most W*D blocks are read ahead (each at most WORKER_BLOCK_BYTES of
inputs, or one micro-batch where that is bigger: :func:`.blocks.block_size`; the shared memory
is W*D slots of that size), and the slots are used again
instead of new shared memory per block, whose page faults cost more than the read itself.

Exactly-once is the loop's, not the workers': blocks come back in the order they were handed
out, and the loop moves its cursor only past micro-batches it trained. Blocks read ahead of a
stop are dropped, and an abandoned feed's blocks are drained before the next one.

Signals: the workers start with the stop signals blocked and ignore them once they run, so a
signal sent to the rank's process group or job step reaches only the rank. Ending:
:meth:`Workers.close` at the rank's end (and at interpreter exit); a rank that ends any other
way (``os._exit`` on an error, SIGKILL) takes them along: the parent-death signal, and the end
of their pipe.
"""

from __future__ import annotations

import atexit
import signal
from collections import deque

import numpy as np

from ..rank.userframes import user_traceback

# The signals a rank may be asked to stop with (train.preemption.signal, SIGTERM) and ^C.
BLOCKED = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
ALIGN = 64
# Blocks read by workers are bigger than the rank's own (blocks.IN_PROCESS_BLOCK_BYTES): each is a hand-over
# between two processes, and a one-core rank's worker waits for the core at each. 64-step epochs
# on one core, workers 1 against 0 (bench/epoch_boundary.py, three runs each): 1.22, 0.87 and
# 1.03 with 4 MiB blocks, 1.22, 1.51 and 1.42 with 1 MiB.
WORKER_BLOCK_BYTES = 4 << 20


def _ignore_stops_and_die_with_parent() -> None:
    import ctypes
    import multiprocessing
    import os

    signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    for sig in BLOCKED:
        signal.signal(sig, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        libc.prctl(PR_SET_NAME, b"hpcsuite-loader", 0, 0, 0)     # its name in ps and top
    except (OSError, AttributeError):     # not Linux: the end of the pipe still ends it
        pass
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:   # the rank was gone already
        os._exit(0)


def serve(conn, recipe) -> None:
    """A worker: read the blocks the rank sends into the slot it names, until told to stop."""
    from multiprocessing import shared_memory

    from ...usercode import blame

    _ignore_stops_and_die_with_parent()
    sources: dict = {}
    slots: list = []
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):       # the rank is gone
            return
        if task is None:
            break
        if task[0] == "slots":
            for s in slots:
                s.close()
            slots = [shared_memory.SharedMemory(name) for name in task[1]]
            continue
        _, which, slot, ids = task
        try:
            data = sources.get(which)
            if data is None:
                data = sources[which] = recipe.reopen(which)
            with blame(getattr(data, "key", "train.data"), getattr(data, "ref", None)):
                label = read_into(data, ids, slots[slot].buf)     # a user's dataset: its key
            conn.send(("ok", label))
        except BaseException as e:  # noqa: BLE001 - the rank re-raises it
            conn.send(("error", _portable(e), user_traceback(e) + "\n"))
    for s in slots:
        s.close()


def layout(data, n: int) -> tuple[tuple, tuple, int]:
    """(x shape, y shape, y's offset) of a block of ``n`` samples of ``data`` in a slot."""
    xs, ys = (n, *data.shape), (n, *data.target_shape)
    return xs, ys, -(-4 * int(np.prod(xs)) // ALIGN) * ALIGN


def slot_bytes(data, n: int) -> int:
    xs, ys, at = layout(data, n)
    return at + 8 * int(np.prod(ys))


def read_into(data, ids, buf) -> str:
    """Samples ``ids`` of ``data`` into ``buf`` (:func:`layout`); returns the labels' dtype."""
    xs, ys, at = layout(data, len(ids))
    x = np.ndarray(xs, np.float32, buf)
    if getattr(data, "reads_into", False):
        label = np.dtype(np.int64 if data.classes is not None else np.float32)
        data.get(ids, (x, np.ndarray(ys, label, buf, at)))
        return label.str
    gx, gy = data.get(ids)
    x[...] = gx
    np.ndarray(ys, gy.dtype, buf, at)[...] = gy
    return gy.dtype.str


def _portable(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any unpicklable exception
        return RuntimeError(f"{type(e).__name__}: {e}")


class Workers:
    """``count`` loader processes for the run, each ``depth`` blocks ahead at most."""

    def __init__(self, recipe, count: int, depth: int):
        """``recipe``: the training data's :class:`.data.Recipe` (a worker opens either of the
        two with it)."""
        import multiprocessing
        from multiprocessing import resource_tracker

        self.depth = depth
        self.pending: deque = deque()       # (worker, slot) of blocks sent, not yet received
        self.slots: list = []               # [worker][slot] SharedMemory
        self.size = 0                       # bytes of each slot
        self.named = False                  # the slots' names still exist in /dev/shm
        self.unmapped: set = set()          # workers that may not have mapped them yet
        ctx = multiprocessing.get_context("spawn")   # forking a rank that initialised MPI is unsafe
        # The mask is inherited: no stop signal can reach a worker before it ignores them.
        # multiprocessing's resource tracker unblocks SIGTERM and SIGINT after starting
        # itself (for the shared memory), so it is started first.
        resource_tracker.ensure_running()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        self.conns, self.procs = [], []
        try:
            for i in range(count):
                ours, theirs = ctx.Pipe()
                p = ctx.Process(target=serve, args=(theirs, recipe), name=f"hpcsuite-loader-{i}",
                                daemon=False)
                p.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(p)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        atexit.register(self.close)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def feed(self, data, groups):
        """(group, xs, ys) for each group of micro-batches of ``data`` (which carries its
        :func:`.data.open_train_eval` recipe), in order: xs [k, B, *shape] float32, ys
        [k, B, ...], arrays of their own."""
        self._drain()
        n, depth, which = len(self.conns), self.depth, data.recipe.which
        ids = [np.concatenate([b.ids for b in g]) if len(g) > 1 else g[0].ids for g in groups]
        need = max((slot_bytes(data, len(i)) for i in ids), default=0)
        if need > self.size:
            self._resize(need)

        def send(j):
            w, s = j % n, (j // n) % depth
            self.conns[w].send(("read", which, s, ids[j]))
            self.pending.append((w, s))

        for j in range(min(len(groups), n * depth)):
            send(j)
        for j, group in enumerate(groups):
            w, s = self.pending.popleft()
            label = self._receive(w)
            xs, ys, at = layout(data, len(ids[j]))
            buf = self.slots[w][s].buf
            x = np.array(np.ndarray(xs, np.float32, buf))
            y = np.array(np.ndarray(ys, np.dtype(label), buf, at))
            if j + n * depth < len(groups):          # the slot is free again: refill it
                send(j + n * depth)
            k = len(group)
            yield group, x.reshape(k, -1, *x.shape[1:]), y.reshape(k, -1, *y.shape[1:])

    def _receive(self, w: int) -> str:
        try:
            reply = self.conns[w].recv()
        except (EOFError, OSError):
            p = self.procs[w]
            p.join(1)
            raise RuntimeError(f"loader worker {w} (pid {p.pid}) ended unexpectedly (exit code "
                               f"{p.exitcode}); train.data.workers: 0 reads in the rank itself") \
                from None
        self._attached(w)
        if reply[0] == "error":
            _, e, text = reply
            e.add_note(f"in loader worker {w} (pid {self.procs[w].pid}):\n{text.rstrip()}")
            raise e
        return reply[1]

    def _drain(self) -> None:
        while self.pending:
            w, _ = self.pending.popleft()
            try:
                self.conns[w].recv()
                self._attached(w)
            except (EOFError, OSError):
                pass

    def _attached(self, w: int) -> None:
        """Worker ``w`` replied, so it has mapped its slots: once all have, the slots' names
        go (the memory stays while mapped), and no way of ending leaves them behind."""
        self.unmapped.discard(w)
        if self.named and not self.unmapped:
            for mine in self.slots:
                for s in mine:
                    s.unlink()
            self.named = False

    def _resize(self, size: int) -> None:
        from multiprocessing import shared_memory

        self._free_slots()
        self.size = size
        self.slots = [[shared_memory.SharedMemory(create=True, size=size)
                       for _ in range(self.depth)] for _ in self.conns]
        for conn, mine in zip(self.conns, self.slots):
            conn.send(("slots", [s.name for s in mine]))
        self.named, self.unmapped = True, set(range(len(self.conns)))

    def _free_slots(self) -> None:
        for mine in self.slots:
            for s in mine:
                s.close()
                if self.named:
                    s.unlink()
        self.slots, self.named = [], False

    def close(self) -> None:
        """End the workers (one that does not leave when asked is killed); free the slots."""
        if not self.procs:
            return
        atexit.unregister(self.close)
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self.pending = [], [], deque()
        self._free_slots()
