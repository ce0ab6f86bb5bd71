"""The framework-free checkpoint layer: atomic saves, verification, retention."""

import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from hpcsuite.runs.checkpoint_dir import MANIFEST, MARKER, newest_checkpoint
from hpcsuite.runtime.session.checkpoint import CheckpointStore

pytestmark = pytest.mark.filterwarnings("ignore")


def tensors(step, size=16):
    rng = np.random.default_rng(step)
    return {"model": {"w": rng.standard_normal((size, size)).astype(np.float32),
                      "b": np.arange(size, dtype=np.float32)},
            "optimizer": {"state.0.momentum_buffer": np.full(size, step, np.float32)}}


def save(store, step, **kw):
    return store.save(step, tensors(step, **kw), {"cursor": {"epoch": 0, "consumed": step * 10}})


def test_roundtrip_and_manifest(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    saved = save(store, 5)
    loaded = store.latest()
    assert loaded.step == 5 and loaded.path == saved.path
    assert loaded.manifest["cursor"] == {"epoch": 0, "consumed": 50}
    for group, arrays in tensors(5).items():
        for name, arr in arrays.items():
            np.testing.assert_array_equal(loaded.tensors[group][name], arr)
    files = loaded.manifest["files"]
    assert set(files) == {"model.safetensors", "optimizer.safetensors"}
    assert all(len(f["sha256"]) == 64 for f in files.values())
    assert not any(p.suffix in (".pt", ".pkl", ".pickle") for p in saved.path.iterdir())


def test_keeps_the_last_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        save(store, step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def test_the_login_nodes_reader_finds_what_the_ranks_committed(tmp_path):
    """runs.checkpoint_dir's reader (submit, status) and the writer agree on the names: the
    newest committed step, not a newer one that lost its marker."""
    store = CheckpointStore(tmp_path, keep=3)
    save(store, 4)
    torn = save(store, 12).path
    (torn / MARKER).unlink()
    path, manifest = newest_checkpoint(tmp_path)
    assert path.name == "step-00000004" and manifest["step"] == 4
    assert store.latest().path == path
    assert newest_checkpoint(tmp_path / "none") is None


def test_resaving_the_same_step_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    save(store, 7)
    store.save(7, tensors(99), {"cursor": {"epoch": 1, "consumed": 0}})
    assert store.latest().manifest["cursor"]["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000007"]


@pytest.mark.parametrize("damage", ["no-marker", "truncated", "flipped", "manifest-edited",
                                    "missing-file", "marker-garbage"])
def test_damaged_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, damage):
    store = CheckpointStore(tmp_path, keep=5)
    save(store, 1)
    bad = save(store, 2).path
    model = bad / "model.safetensors"
    if damage == "no-marker":
        (bad / MARKER).unlink()
    elif damage == "truncated":
        model.write_bytes(model.read_bytes()[:-10])
    elif damage == "flipped":
        data = bytearray(model.read_bytes())
        data[-1] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "manifest-edited":
        m = json.loads((bad / "manifest.json").read_text())
        m["step"] = 3
        (bad / "manifest.json").write_text(json.dumps(m))
    elif damage == "missing-file":
        (bad / "optimizer.safetensors").unlink()
    else:
        (bad / MARKER).write_text("zzz\n")
    with caplog.at_level(logging.WARNING):
        loaded = store.latest()
    assert loaded.step == 1
    assert "skipping checkpoint" in caplog.text and "step-00000002" in caplog.text


def test_empty_or_missing_store(tmp_path):
    assert CheckpointStore(tmp_path / "nothing").latest() is None


KILLER = """
import sys, time, numpy as np
from hpcsuite.runtime.session import checkpoint
from hpcsuite.runtime.session.checkpoint import CheckpointStore

where = sys.argv[2]          # the file of the save to stop in (its name starts so)
real = checkpoint.write_hashed

def stopping(path, data, hash_it=True):
    if path.name.startswith(where):
        with open(path, "wb") as f:          # half of it on disk, then wait to be killed
            f.write(bytes(memoryview(data)[: max(1, len(data) // 2)]))
            f.flush()
        print("in the save", flush=True)
        time.sleep(600)
    return real(path, data, hash_it)

checkpoint.write_hashed = stopping
store = CheckpointStore(sys.argv[1], keep=5)
store.save(9, {"model": {"w": np.ones((256, 1024), np.float32)}},
           {"cursor": {"epoch": 0, "consumed": 0}})
"""


@pytest.mark.parametrize("where", ["model", MANIFEST, MARKER])
def test_a_killed_save_never_becomes_the_latest(tmp_path, where):
    """kill -9 in the middle of writing the tensors, the manifest or the marker: the previous
    checkpoint stays the latest, and the next save clears what the dead one left."""
    store = CheckpointStore(tmp_path, keep=5)
    save(store, 1)
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path), where],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in the save"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    leftovers = list(tmp_path.glob(".tmp-*"))
    stopped_in = "model.safetensors" if where == "model" else where
    assert len(leftovers) == 1 and (leftovers[0] / stopped_in).exists()
    assert store.latest().step == 1
    save(store, 2)                       # the next save cleans the dead save's directory
    assert not list(tmp_path.glob(".tmp-*"))
    assert store.latest().step == 2


def test_scalars_keep_their_shape(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"optimizer": {"iteration": np.asarray(np.int64(7))}}, {})
    assert store.latest().tensors["optimizer"]["iteration"].shape == ()


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    from hpcsuite.runtime.session.checkpoint import CheckpointError

    store = CheckpointStore(tmp_path, keep=2)
    save(store, 1)
    save(store, 2)
    (tmp_path / "step-00000002" / "model.safetensors").write_bytes(b"torn")
    assert store.latest().step == 1                       # a damaged newer one: the older one
    (tmp_path / "step-00000001" / MANIFEST).write_text("{")
    with pytest.raises(CheckpointError, match=r"step-00000002/model.safetensors: 4 bytes.*no "
                                              r"intact checkpoint in .* \(2 damaged\)"):
        store.latest()


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    import errno

    from hpcsuite.runtime.session import checkpoint
    from hpcsuite.runtime.session.checkpoint import CheckpointError

    store = CheckpointStore(tmp_path, keep=1)
    save(store, 1)
    real = checkpoint.write_hashed

    def full(path, data, hash_it=True):
        if path.name == "optimizer.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, hash_it)

    monkeypatch.setattr(checkpoint, "write_hashed", full)
    with pytest.raises(CheckpointError, match=r"optimizer.safetensors: saving the checkpoint of "
                                              r"step 2 failed: No space left on device; the "
                                              r"previous checkpoint .*step-00000001 is intact"):
        save(store, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]   # no torn leftovers
    assert store.latest().step == 1


def test_time_left_parsing_and_the_measured_stop():
    from hpcsuite.runtime.session.timelimit import TimeLimit, parse_time_left

    assert [parse_time_left(t) for t in ("1-02:03:04", "2:03:04", "3:04", "UNLIMITED",
                                         "NOT_SET", "", "5")] == \
        [93784.0, 7384.0, 184.0, None, None, None, None]
    tl = TimeLimit(100.0, now=0.0)
    # No save measured yet: 1 s + 3 MB at 50 MB/s, twice, + 2 votes of 0.25 s + 2 steps + exit.
    need = TimeLimit.needed([], 3_000_000, 0.1, 0.25)
    assert need == pytest.approx(2 * 1.06 + 0.5 + 0.2 + 10.0)
    assert not tl.near([], 3_000_000, 0.1, 0.25, now=100.0 - need - 0.01)
    assert tl.near([], 3_000_000, 0.1, 0.25, now=100.0 - need + 0.01)
    # A measured 20 s save moves the stop 40 s earlier.
    assert TimeLimit(100.0, now=0.0).near([20.0, 3.0], 0, 0.1, 0.25, now=100.0 - 50.0)
    assert TimeLimit(None).near([], 0, 0.1, 0.25) is False


def test_a_stop_is_for_the_time_limit_when_the_clock_said_so_or_the_signal_came_near_it():
    from hpcsuite.runtime.session.timelimit import TimeLimit, stop_reason

    assert stop_reason(None, 30) == "preempted"
    assert stop_reason(TimeLimit(3600.0), 30) == "preempted"        # a signal an hour before
    assert stop_reason(TimeLimit(100.0), 30) == "time_limit"        # Slurm's warning, early
    watched = TimeLimit(3600.0)
    watched.hit = True
    assert stop_reason(watched, 30) == "time_limit"
