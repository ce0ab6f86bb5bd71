"""The framework-free checkpoint layer: atomic saves, verification, retention."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hpcsuite.runtime.checkpoint import MARKER, CheckpointStore

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
import sys, numpy as np
from hpcsuite.runtime.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], keep=5)
big = {"model": {"w": np.ones((64, 1024, 1024), np.float32)}}   # 256 MiB: slow enough to kill
print("saving", flush=True)
store.save(9, big, {"cursor": {"epoch": 0, "consumed": 0}})
print("saved", flush=True)
"""


def test_a_killed_save_never_becomes_the_latest(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    save(store, 1)
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "saving"
    # Kill it while the temporary directory exists, i.e. in the middle of the save.
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".tmp-step-00000009-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    leftovers = list(tmp_path.glob(".tmp-*"))
    if not leftovers:
        pytest.skip("the save finished before it could be killed")
    assert store.latest().step == 1
    save(store, 2)                       # the next save cleans the dead save's directory
    assert not list(tmp_path.glob(".tmp-*"))
    assert store.latest().step == 2


def test_scalars_keep_their_shape(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"optimizer": {"iteration": np.asarray(np.int64(7))}}, {})
    assert store.latest().tensors["optimizer"]["iteration"].shape == ()
