"""train.data.workers > 0 (torch): the loader workers start once per run, not once per epoch;
a stop signal sent to the rank's whole process group reaches only the rank; no worker outlives
the rank; every epoch's samples are trained exactly once, across a stop and a resume with
blocks read ahead."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rank_by_hand import write_job

from hpcsuite.runs.results import Results

# A user's dataset that writes its process id each time a process opens it: the rank once,
# then each loader worker when it first reads.
FACTORY = """
import os
import time
import numpy as np


class Data:
    def __init__(self, n, slow, fail_at):
        rng = np.random.default_rng(3)
        self.x = rng.standard_normal((n, 8)).astype(np.float32)
        self.y = (self.x.sum(axis=1) > 0).astype(np.int64)
        self.slow, self.fail_at, self.calls = slow, fail_at, 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, ids):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("sample 13 is corrupt")
        if self.slow:
            time.sleep(self.slow)
        return self.x[ids], self.y[ids]


def make(n, log, slow=0.0, fail_at=0):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    return Data(n, slow, fail_at)
"""

SAMPLES = 4096       # 256 micro-batches of 16 an epoch: four blocks of 64


def job(tmp_path: Path, workers: int, epochs: int, slow: float = 0.0, steps: int = 0,
        backend: str = "torch", fail_at: int = 0) -> Path:
    run_dir = tmp_path / "runs" / "workers" / "local"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "data.py").write_text(FACTORY)
    return write_job(run_dir, {
        "name": "workers", "output_dir": str(tmp_path / "runs"),
        "train": {"backend": backend, "epochs": epochs, "max_steps": steps or None, "batch_size": 16, "ledger": True, "lr": 0.05,
                  "data": {"kind": "python", "factory": "data.py:make", "workers": workers,
                           "prefetch": 2, "args": {"n": SAMPLES, "log": str(run_dir / "opened"),
                                                   "slow": slow, "fail_at": fail_at}},
                  "checkpoint": {"every_steps": 1000}}})


def start_rank(job_path: Path) -> subprocess.Popen:
    """`python -m hpcsuite train` as the only rank, outside Slurm, leading its own process
    group (as a launcher's task does: a signal to the group reaches everything it started)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_"))}
    env["HPCSUITE_RUN_DIR"] = str(job_path.parent)
    return subprocess.Popen([sys.executable, "-m", "hpcsuite", "train", "--job", str(job_path)],
                            cwd=job_path.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def openers(run_dir: Path) -> list[int]:
    path = run_dir / "opened"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ledger_epochs(run_dir: Path) -> dict[int, list[int]]:
    epochs: dict[int, list[int]] = {}
    for path in sorted((run_dir / "ledger").glob("*.txt")):
        for line in path.read_text().splitlines():
            epoch, _step, *ids = line.split()
            epochs.setdefault(int(epoch), []).extend(int(i) for i in ids)
    return epochs


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_two_workers_start_once_over_three_epochs_and_end_with_the_rank(tmp_path, backend):
    path = job(tmp_path, workers=2, epochs=3, backend=backend)
    rank = start_rank(path)
    out, err = rank.communicate(timeout=220)
    assert rank.returncode == 0, out + err
    assert "Traceback" not in err, err
    run_dir = path.parent
    pids = openers(run_dir)
    assert pids[0] == rank.pid
    workers = pids[1:]
    # One start per worker for the whole run: before, each of the 3 epochs started 2 more.
    assert len(workers) == len(set(workers)) == 2, pids
    assert not [p for p in workers if alive(p)], "a loader worker outlived its rank"
    results = Results.load(run_dir / "results.json")
    assert results.status == "completed" and results.final_step == 3 * SAMPLES // 16
    epochs = ledger_epochs(run_dir)
    assert sorted(epochs) == [0, 1, 2]
    for ids in epochs.values():
        assert sorted(ids) == list(range(SAMPLES))     # each sample once an epoch


@pytest.mark.timeout(300)
def test_a_stop_signal_to_the_process_group_reaches_only_the_rank(tmp_path):
    """SIGTERM to the rank's whole group with blocks read ahead: the workers have it blocked
    (their mask says so), the rank stops at a step boundary and saves, its workers end with
    it; the resumed run trains each sample exactly once per epoch over both attempts."""
    path = job(tmp_path, workers=1, epochs=10, slow=0.3, steps=1000)
    run_dir = path.parent
    rank = start_rank(path)
    deadline = time.monotonic() + 200
    while len(openers(run_dir)) < 2:
        assert rank.poll() is None, rank.communicate()
        assert time.monotonic() < deadline, "no loader worker started"
        time.sleep(0.1)
    worker = openers(run_dir)[1]
    for task in Path(f"/proc/{worker}/task").iterdir():     # every thread of the worker
        status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines())
        blocked = int(status["SigBlk"], 16)
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            assert blocked & (1 << (sig - 1)), f"a thread of the worker takes {sig.name}"
    time.sleep(1.0)                  # training, the worker reading ahead (0.3 s a block)
    os.killpg(rank.pid, signal.SIGTERM)
    out, err = rank.communicate(timeout=120)
    assert rank.returncode == 0, out + err
    assert "Traceback" not in err and "killed by signal" not in err, err
    assert not alive(worker), "the loader worker outlived its rank"
    first = Results.load(run_dir / "results.json")
    assert first.status == "preempted", first.status
    assert 0 < first.final_step < 1000

    resumed = start_rank(path)       # the rest of the run, from the checkpoint of the stop
    out, err = resumed.communicate(timeout=200)
    assert resumed.returncode == 0, out + err
    final = Results.load(run_dir / "results.json")
    assert final.status == "completed" and final.final_step == 1000
    epochs = ledger_epochs(run_dir)
    assert sorted(epochs) == [0, 1, 2, 3]
    for e in (0, 1, 2):
        assert sorted(epochs[e]) == list(range(SAMPLES)), f"epoch {e} not exactly once"
    assert len(epochs[3]) == len(set(epochs[3])) == (1000 - 3 * 256) * 16


@pytest.mark.timeout(180)
def test_a_dataset_error_in_a_worker_fails_the_rank_in_the_users_words_and_ends_the_worker(tmp_path):
    """The worker's fourth call of the dataset raises (its second read: the rank makes three): the
    rank fails naming the error, and its worker ends with it (os._exit: no close ran)."""
    path = job(tmp_path, workers=1, epochs=2, fail_at=4)
    rank = start_rank(path)
    out, err = rank.communicate(timeout=160)
    assert rank.returncode == 1, out + err
    assert "failed in train.data.factory (data.py:make)" in err, err
    assert "ValueError: sample 13 is corrupt" in err and "in loader worker 0" in err, err
    worker = openers(path.parent)[1]
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker), "the loader worker outlived its failed rank"


@pytest.mark.timeout(180)
def test_the_pool_reads_every_epoch_in_order_and_close_leaves_no_child(tmp_path):
    """In one process: three epochs and an abandoned fourth through one pool, the blocks in
    order and equal to in-process reads, the same workers throughout, none left after close."""
    probe = f"""
import multiprocessing, numpy as np
from hpcsuite.runtime.input.data import open_train_eval
from hpcsuite.runtime.input.sharding import Cursor, Sharder
from hpcsuite.runtime.input.workers import Workers
from hpcsuite.runtime.input.blocks import plan_blocks
from hpcsuite.submit.spec import spec_from_dict

job = spec_from_dict({{"name": "w", "train": {{"batch_size": 8, "data": {{"samples": 64}},
                      "eval": {{"split": 0.25}}}}}}, "t")
data, held = open_train_eval(job.train, 1)
pool = Workers(data.recipe, 2, 2)
seen = []
for epoch in range(3):
    groups = plan_blocks(list(Sharder(len(data), 1, 0, 8, 1, 2).epoch(Cursor(epoch, 0))), 2)
    for group, xs, ys in pool.feed(data, groups):
        seen += [int(i) for b in group for i in b.ids]
        x, y = data.get(np.concatenate([b.ids for b in group]))
        assert np.array_equal(xs, x.reshape(xs.shape)) and np.array_equal(ys, y.reshape(ys.shape))
pids = pool.pids()
for group, xs, ys in pool.feed(data, groups):
    break                           # an epoch abandoned with blocks in flight
groups = plan_blocks(list(Sharder(len(held), 1, 0, 4, 1).epoch(Cursor(0, 0))), 3)
evaluated = [int(i) for group, xs, ys in pool.feed(held, groups) for b in group for i in b.ids]
assert sorted(evaluated) == list(range(len(held))), evaluated
groups = plan_blocks(list(Sharder(len(data), 1, 0, 8, 1).epoch(Cursor(5, 0))), 6)
for group, xs, ys in pool.feed(data, groups):    # bigger blocks: bigger slots, mapped anew
    x, y = data.get(np.concatenate([b.ids for b in group]))
    assert np.array_equal(xs, x.reshape(xs.shape)) and np.array_equal(ys, y.reshape(ys.shape))
assert pool.pids() == pids, "workers started again"
pool.close()
print(len(seen), len(pids), len(multiprocessing.active_children()))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=170, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["144", "2", "0"]
