"""The GPU input pipeline's logic (hpcsuite/runtime/input/prefetch.py) on the CPU: the thread, the
bounded slot ring, the hand-over in order, the stop with batches queued, resident data and the
train.data.on_device decision. Pinning, streams and events only run on a GPU
(tests/test_gpu.py)."""

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hpcsuite.errors import UserError
from hpcsuite.runtime.input.data import Synthetic
from hpcsuite.runtime.input.sharding import Cursor, Sharder
from hpcsuite.submit.spec import Data

torch = pytest.importorskip("torch")

from hpcsuite.runtime.input import prefetch  # noqa: E402


class Counted:
    """A source without ``reads_into`` that counts its reads (and can fail or be slow)."""

    def __init__(self, data, fail_at=None):
        self.data, self.fail_at, self.calls = data, fail_at, 0
        self.shape, self.classes, self.target_shape = data.shape, data.classes, ()

    def __len__(self):
        return len(self.data)

    def get(self, ids):
        self.calls += 1
        if self.calls == self.fail_at:
            raise UserError("train.data.factory: broken.py:make: ds[ids] raised ValueError")
        return self.data.get(ids)


def _data(samples=50):
    return Synthetic(Data(samples=samples, shape=[3, 2, 2], classes=4), 2)


def _batches(n=50, world=2, rank=1, batch=8, accumulation=1):
    return list(Sharder(n, world, rank, batch, 5, accumulation).epoch(Cursor(0, 0)))


def _check(data, got, batches):
    assert [b for b, _ in got] == batches
    for batch, (x, y, w) in got:
        want_x, want_y = data.get(batch.ids)
        np.testing.assert_array_equal(x.numpy(), want_x)
        np.testing.assert_array_equal(y.numpy(), want_y)
        np.testing.assert_array_equal(w.numpy(), batch.weights)


@pytest.mark.parametrize("reads_into", [True, False], ids=["into-slots", "copied-into-slots"])
def test_every_micro_batch_comes_in_order_with_its_padding(reads_into):
    data = _data()
    source = data if reads_into else Counted(data)
    batches = _batches()
    assert batches[-1].real < 8                                   # the last one is padded
    p = prefetch.Prefetcher(torch, "cpu", depth=2)
    _check(data, list(p.feed(source, batches)), batches)
    # The next epoch reads into the same slots: still each micro-batch's own samples.
    _check(data, list(p.feed(source, batches[::-1])), batches[::-1])
    assert len(p._rings) == 1 and len(next(iter(p._rings.values()))) == 2


@pytest.mark.parametrize("depth", [1, 3])
def test_the_thread_never_gathers_more_than_depth_ahead(depth):
    """While micro-batch k trains, the thread has read at most k+1 (on its way to the device)
    plus ``depth`` (the slots): the pinned memory the log states."""
    source = Counted(_data(400))
    batches = _batches(400, 1, 0, 8)
    p = prefetch.Prefetcher(torch, "cpu", depth)
    ahead = []
    for k, _ in enumerate(p.feed(source, batches)):
        time.sleep(0.002)                     # a slow step: the thread fills every slot
        ahead.append(source.calls - (k + 1))
    assert max(ahead) == depth + 1 and min(ahead[:-depth - 1]) >= 1


def test_a_stop_with_batches_queued_ends_the_thread_and_drops_them():
    source = Counted(_data(400))
    batches = _batches(400, 1, 0, 8)
    p = prefetch.Prefetcher(torch, "cpu", 4)
    before = threading.active_count()
    feed = p.feed(source, batches)
    got = [next(feed) for _ in range(5)]
    time.sleep(0.05)
    assert source.calls > 5                   # gathered ahead of what was handed out
    feed.close()                              # what the loop's return does to the generator
    assert threading.active_count() == before
    assert [b for b, _ in got] == batches[:5]
    # The next feed (a resumed epoch) starts where it is told, in the same slots.
    _check(source.data, list(p.feed(source, batches[5:9])), batches[5:9])


def test_a_failing_read_on_the_thread_is_raised_in_the_training_thread():
    source = Counted(_data(), fail_at=4)      # raised when the 3rd is handed out (the 4th copied)
    feed = prefetch.Prefetcher(torch, "cpu", 2).feed(source, _batches())
    assert len([next(feed), next(feed)]) == 2
    with pytest.raises(UserError, match="train.data.factory: broken.py:make"):
        next(feed)


def test_resident_data_gives_the_same_micro_batches():
    data = _data()
    batches = _batches()
    r = prefetch.Resident(torch, "cpu", data)
    assert r.x.shape == (50, 3, 2, 2) and r.y.dtype == torch.int64
    _check(data, list(r.feed(batches)), batches)
    odd = batches[:2] + [batches[2]._replace(ids=batches[2].ids[:5], weights=batches[2].weights[:5],
                                             real=min(5, batches[2].real))]
    _check(data, list(r.feed(odd)), odd)


@pytest.mark.parametrize("steps, limit", [(1, 10 ** 9), (2, 10 ** 9), (16, 10 ** 9), (16, 1)])
def test_resident_micro_batches_gathered_together_are_each_their_own(monkeypatch, steps, limit):
    """Up to GATHER_STEPS micro-batches (and GATHER_BYTES) come from one gather: each one is
    still exactly its own ids, in order, the last chunk short."""
    monkeypatch.setattr(prefetch, "GATHER_STEPS", steps)
    monkeypatch.setattr(prefetch, "GATHER_BYTES", limit)
    data = _data()
    batches = _batches()
    got = list(prefetch.Resident(torch, "cpu", data).feed(batches))
    _check(data, got, batches)
    assert [b for b, _ in got] == batches


@pytest.mark.parametrize("setting, free, resident", [
    ("auto", 4 * 50 * (48 + 8), True),       # exactly a quarter of the free memory
    ("auto", 4 * 50 * (48 + 8) - 1, False),
    (True, 10, True),
    (False, 10 ** 12, False),
])
def test_on_device_puts_the_data_on_the_device_when_it_fits_a_quarter(setting, free, resident):
    data = _data()
    assert prefetch.data_bytes(data) == 50 * (48 + 8)
    feeds = prefetch.Input(torch, "cpu", 2, setting, free_memory=lambda: free)
    got = feeds.resident(data)
    assert (got is not None) == resident
    assert feeds.resident(data) is got                             # decided once per source


def test_on_device_true_that_does_not_fit_is_one_line(monkeypatch):
    def full(*a):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(prefetch, "Resident", full)
    with pytest.raises(UserError, match=r"train.data.on_device: true, but the data's 0.0 MB"):
        prefetch.Input(torch, "cpu", 2, True, free_memory=lambda: 10).resident(_data())


class OutOfMemoryOnCopy(Counted):
    """A source whose second chunk's copy to the GPU runs out of memory: what a GPU whose
    free memory another process took after ``auto`` measured it raises."""

    def get(self, ids):
        self.calls += 1
        if self.calls == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.data.get(ids)


@pytest.mark.parametrize("rank", [0, 1])
def test_on_device_auto_whose_copy_runs_out_of_memory_falls_back_to_prefetching(
        monkeypatch, caplog, rank):
    """auto chose the GPU by its free memory, then the copy ran out of it: the data stays on
    the host and comes through the prefetching pipeline, said in the rank's log; never the
    exit 2 (not requeued) about `on_device: true` that the user did not set."""
    import logging

    monkeypatch.setattr(prefetch, "RESIDENT_CHUNK_BYTES", 20 * (48 + 8))   # 3 chunks
    data = OutOfMemoryOnCopy(_data())
    feeds = prefetch.Input(torch, "cpu", 2, "auto", rank=rank, free_memory=lambda: 10 ** 9)
    with caplog.at_level(logging.INFO, logger="hpcsuite.runtime.input.prefetch"):
        assert feeds.resident(data) is None
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].startswith(
        f"input: rank {rank}: copying the data (0.0 MB) to cpu ran out of GPU memory "
        "(CUDA out of memory. Tried to allocate 2.00 GiB); it stays on the host and each "
        "micro-batch is prefetched (train.data.on_device: auto; set false to skip the try)"), said
    assert feeds.resident(data) is None and data.calls == 2          # decided once
    batches = _batches()
    got = list(feeds.prefetcher.feed(data, batches))
    _check(data.data, got, batches)


STOPPED_RUN = """
import json, sys, time
import torch
from hpcsuite.runtime.session.loop import Trainer
from hpcsuite.runtime.session.policy import Policy
from hpcsuite.runtime.input.prefetch import Input
from hpcsuite.runtime.rank.signals import StopFlag
from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
from hpcsuite.submit.spec import spec_from_dict

run_dir, stop_at = sys.argv[1], int(sys.argv[2])
job = spec_from_dict({"name": "pf", "output_dir": run_dir, "train": {
    "batch_size": 8, "grad_accumulation": 2, "epochs": 6, "ledger": True, "lr": 0.05,
    "checkpoint": {"every_steps": 100000, "dir": run_dir + "/ck"},
    "data": {"samples": 230, "shape": [6], "classes": 3, "prefetch": 4}}}, "t")
backend = TorchBackend(job)
flag = StopFlag()
# A vote every 5 steps, whatever the step time: the stop lands at a known step, not at an
# epoch's end (where nothing of the epoch is left to gather).
Policy.propose_interval = staticmethod(lambda times, seconds=0: 5)
trainer = Trainer(job, run_dir, backend, flag)
build, step, queued = backend.build, backend.micro_step, []

def build_on_the_pipeline(data):
    build(data)
    # the GPU pipeline with the data on the host: on the CPU here, on the GPU where there is one
    backend._input = Input(torch, backend.device, 4, False)

def slow_step(inputs, scale, last, padded=True):
    global micro_batches
    micro_batches = globals().get("micro_batches", 0) + 1
    time.sleep(0.003)       # a step slow enough for the thread to fill its slots
    if micro_batches == stop_at:
        flag.raise_("USR1")
    if flag.raised and last:
        queued.append(backend._input.prefetcher.queued)
    return step(inputs, scale, last, padded)

backend.build = build_on_the_pipeline
backend.micro_step = slow_step
per_rank, results = trainer.run()
print(json.dumps({"status": results.status, "steps": per_rank["steps"],
                  "start": trainer.session.progress.start_step, "queued": queued[-1] if queued else 0,
                  "cursor": list(trainer.session.progress.cursor)}))
"""


@pytest.mark.timeout(300)
def test_a_stop_with_batches_queued_trains_each_sample_once_across_the_resume(tmp_path):
    """The managed loop on the prefetch thread (the GPU pipeline, run on the CPU) is stopped
    mid-run with micro-batches gathered ahead; it saves at the agreed step and the resumed
    attempt continues from its cursor: the ledger has every sample exactly once per epoch,
    none of the queued micro-batches trained by the stopped attempt."""
    import os

    script = tmp_path / "run.py"
    script.write_text(STOPPED_RUN)
    outs = []
    for attempt, stop_at in ((0, 61), (1, 0)):
        env = dict(os.environ, SLURM_RESTART_COUNT=str(attempt))
        done = subprocess.run([sys.executable, str(script), str(tmp_path), str(stop_at)],
                              capture_output=True, text=True, timeout=140, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = outs
    # The flag, raised in step 31, is voted after it and agreed after step 32 (epoch 2's 2nd).
    assert first["status"] == "preempted" and first["steps"] == 32 and first["queued"] >= 2
    assert second["status"] == "completed" and second["start"] == first["steps"]
    assert second["cursor"][0] == 6
    lines = {a: (tmp_path / "ledger" / f"rank-0-attempt-{a}.txt").read_text().splitlines()
             for a in (0, 1)}
    # A ledger line names the steps done before its micro-batch: 0 .. steps-1, nothing after.
    assert max(int(line.split()[1]) for line in lines[0]) == first["steps"] - 1
    assert min(int(line.split()[1]) for line in lines[1]) == first["steps"]
    seen: dict[int, list[int]] = {}
    for line in lines[0] + lines[1]:
        epoch, _, *ids = map(int, line.split())
        seen.setdefault(epoch, []).extend(ids)
    assert sorted(seen) == list(range(6))
    for epoch, ids in seen.items():
        assert sorted(ids) == list(range(230)), f"epoch {epoch}"


@pytest.mark.parametrize("value, want", [(None, "auto"), (True, True), (False, False), ("auto", "auto")])
def test_on_device_is_auto_true_or_false(value, want):
    from hpcsuite.submit.spec import spec_from_dict

    data = {"samples": 8} | ({} if value is None else {"on_device": value})
    assert spec_from_dict({"name": "d", "train": {"data": data}}, "job.yaml").train.data.on_device == want


def test_another_on_device_is_refused_in_one_line_naming_the_key():
    from hpcsuite.errors import ConfigError
    from hpcsuite.submit.spec import spec_from_dict

    with pytest.raises(ConfigError) as e:
        spec_from_dict({"name": "d", "train": {"data": {"on_device": "gpu"}}}, "job.yaml")
    assert str(e.value) == "job.yaml: train.data.on_device: 'gpu' is not valid: auto, true or false"


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here "
                         "(torch.cuda.is_available() is False): the pipeline's CUDA path was not run")


@gpu
@pytest.mark.parametrize("resident", [False, True], ids=["prefetched", "resident"])
def test_on_a_gpu_every_micro_batch_arrives_whole_while_the_gpu_lags(resident):
    """The stream and event discipline: each step's kernels are queued behind a GPU sleep, so
    the copies and the thread run far ahead of what reads them; a slot written again too early
    or device memory reused too early would change the sums."""
    data = _data(4000)
    batches = _batches(4000, 1, 0, 64)
    feed = prefetch.Resident(torch, "cuda:0", data).feed(batches) if resident else \
        prefetch.Prefetcher(torch, "cuda:0", 2).feed(data, batches)
    sums = []
    for batch, (x, y, w) in feed:
        assert x.is_cuda and y.is_cuda and w.is_cuda
        torch.cuda._sleep(1_000_000)          # ~0.5 ms of GPU time
        sums.append(torch.stack([x.double().sum(), y.double().sum(), w.double().sum()]))
    got = torch.stack(sums).cpu().numpy()
    for (batch, row) in zip(batches, got):
        want_x, want_y = data.get(batch.ids)
        np.testing.assert_allclose(row, [want_x.astype(np.float64).sum(), want_y.sum(),
                                         batch.weights.sum()], rtol=1e-9, atol=1e-6)


GPU_RUN = """
import json, sys
from hpcsuite.runtime.session.loop import Trainer
from hpcsuite.runtime.frameworks.torch_backend import TorchBackend
from hpcsuite.submit.spec import spec_from_dict
run_dir, on_device = sys.argv[1], json.loads(sys.argv[2])
job = spec_from_dict({"name": "gpu", "output_dir": run_dir, "train": {
    "precision": "amp", "max_steps": 40, "batch_size": 64, "epochs": 3, "ledger": True,
    "eval": {"split": 0.1}, "data": {"samples": 1024, "on_device": on_device}}}, "t")
backend = TorchBackend(job)
per_rank, results = Trainer(job, run_dir, backend).run()
resident = backend._input._resident
print(json.dumps({"device": backend.device, "first": results.loss[0], "last": results.loss[-1],
                  "resident": [r is not None for _, r in resident.values()],
                  "evals": len(results.eval)}))
"""


@gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("on_device", [False, True])
def test_a_gpu_run_trains_and_validates_with_the_data_on_the_host_or_the_gpu(tmp_path, on_device):
    done = subprocess.run([sys.executable, "-c", GPU_RUN, str(tmp_path), json.dumps(on_device)],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["device"] == "cuda:0" and out["last"] < out["first"] and out["evals"] >= 1
    assert out["resident"] == [on_device, on_device]          # the training and held-out data
