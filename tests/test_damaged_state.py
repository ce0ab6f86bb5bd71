"""Damaged state, counted: every way of cutting or garbling the files a run leaves behind is
either read intact or refused with one UserError naming the file, never another exception.

For each kind of file, 150 damaged copies (truncated at a random byte, a random byte flipped,
a random span replaced by noise, emptied) go through the reader that status, submit --wait and
resume use."""

import json
import random

import numpy as np
import pytest

from hpcsuite.runs import attempts, ledger
from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results
from hpcsuite.runtime.session.checkpoint import CheckpointStore
from hpcsuite.runtime.rank.job_io import load_job
from hpcsuite.submit.spec import spec_from_dict

TRIALS = 150


def damage(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 or not data:
        return data[:rng.randrange(len(data) + 1)]
    if kind == 1:
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if kind == 2:
        i = rng.randrange(len(data))
        n = rng.randrange(1, 40)
        return data[:i] + bytes(rng.randrange(256) for _ in range(n)) + data[i + n:]
    return b""


def trials(path, good: bytes, read, seed: int) -> dict:
    """Damage ``path`` TRIALS times; {"intact": n, "refused": n}; anything else fails."""
    rng = random.Random(seed)
    counts = {"intact": 0, "refused": 0}
    for _ in range(TRIALS):
        path.write_bytes(damage(good, rng))
        try:
            read()
            counts["intact"] += 1
        except UserError as e:
            assert path.name in str(e), f"the error does not name {path.name}: {e}"
            assert "\n" not in str(e)
            counts["refused"] += 1
    path.write_bytes(good)
    return counts


def test_results_json(tmp_path):
    Results(job="a", final_step=10, loss=[0.5] * 10, attempt=0).write(tmp_path)
    path = tmp_path / "results.json"
    c = trials(path, path.read_bytes(), lambda: Results.load(path), 1)
    assert c["refused"] > TRIALS // 2


def test_job_json(tmp_path):
    path = tmp_path / "job.json"
    job = spec_from_dict({"name": "a", "train": {"checkpoint": {"every_steps": 5}}}, "t")
    good = json.dumps(job.to_dict(), sort_keys=True).encode()
    c = trials(path, good, lambda: load_job(str(path)), 2)
    assert c["refused"] > TRIALS // 2


def test_attempt_records(tmp_path):
    path = tmp_path / attempts.RECORDS
    good = b"".join(json.dumps({"attempt": k, "outcome": "preempted", "step": 10 * k}).encode() + b"\n"
                    for k in range(4))
    c = trials(path, good, lambda: attempts.read_records(tmp_path), 3)
    assert c["refused"] > TRIALS // 3


def test_ledger(tmp_path):
    (tmp_path / "ledger").mkdir()
    path = tmp_path / "ledger" / "rank-0-attempt-0.txt"
    good = b"".join(f"0 {s} {' '.join(str(4 * s + i) for i in range(4))}\n".encode() for s in range(1, 30))
    c = trials(path, good, lambda: ledger.read(tmp_path), 4)
    assert c["refused"] > TRIALS // 3


@pytest.mark.parametrize("name", ["manifest.json", "COMMITTED", "model.safetensors"])
def test_the_only_checkpoint(tmp_path, name):
    """Resume's reader: damage to the only checkpoint is refused, never a fresh start (None)."""
    store = CheckpointStore(tmp_path / "ck")
    store.save(5, {"model": {"w": np.arange(64, dtype=np.float32)}}, {"cursor": {"epoch": 0}})
    path = tmp_path / "ck" / "step-00000005" / name
    c = trials(path, path.read_bytes(), store.latest, 5)
    assert c["refused"] >= TRIALS - 5     # a flipped byte may still hash the same: never here
