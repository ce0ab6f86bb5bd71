"""Every file hpcsuite writes takes its mode from the umask (issue 51, point 3): a group sharing
a project directory with umask 002 can read and continue each other's runs, a user with 077
keeps theirs private. A reader this user may not read says "permission denied", never "none".
tests/test_e2e_nonroot.py runs two accounts in one group directory on the live cluster."""

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from hpcsuite.errors import UserError
from hpcsuite.runs import attempts, ownership, registry
from hpcsuite.runs.mlflow_store import read_record
from hpcsuite.runs.results import Results, mark_failed, umask, write_json_atomic
from hpcsuite.runs.rundir import RunDir


@pytest.fixture(params=[0o002, 0o022, 0o077])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_umask_is_read_without_being_set(mask):
    assert umask() == mask
    assert umask() == mask


def test_every_file_follows_the_umask(tmp_path, mask, monkeypatch):
    want = 0o666 & ~mask
    write_json_atomic(tmp_path / "results.json", {"a": 1})
    write_json_atomic(tmp_path / "progress.json", {"a": 1}, durable=False)
    registry.record(tmp_path, {"job_id": "1", "name": "a"})
    attempts._append(tmp_path, {"attempt": 0, "outcome": "completed"})
    mark_failed(tmp_path / "FAILED-attempt-0", 0, 1, "boom")
    monkeypatch.setattr(ownership, "_live_state", lambda job_id: None)
    ownership.claim(tmp_path / "checkpoints", "7", tmp_path)
    files = [tmp_path / "results.json", tmp_path / "progress.json", registry.path_in(tmp_path),
             RunDir(tmp_path).attempts, tmp_path / "FAILED-attempt-0",
             tmp_path / "checkpoints" / ".owner.lock", tmp_path / "checkpoints" / ownership.OWNER]
    assert {str(f.name): oct(mode(f)) for f in files} == {str(f.name): oct(want) for f in files}


@pytest.fixture
def open_dir():
    """A directory every account can reach (pytest's are under a 0700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="hpcsuite-modes-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(call) -> str:
    """What ``call()`` raises (its message) or returns, run by uid 65534 in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: never returns
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                said = f"returned {call()!r}"
            except UserError as e:
                said = f"error: {e}"
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    return said


@pytest.mark.skipif(os.geteuid() != 0, reason="reads as another uid: run as root")
def test_a_file_this_user_may_not_read_is_said_as_that(open_dir):
    tmp_path = open_dir
    old = os.umask(0o077)
    try:
        write_json_atomic(tmp_path / "results.json", {"job": "a"})
        write_json_atomic(tmp_path / "mlflow.json", {"run_id": "r"})
        attempts._append(tmp_path, {"attempt": 0, "outcome": "completed"})
        (tmp_path / "checkpoints").mkdir()
        os.chmod(tmp_path / "checkpoints", 0o755)
        write_json_atomic(tmp_path / "checkpoints" / ownership.OWNER, {"job_id": "7"})
    finally:
        os.umask(old)
    for call, path in [(lambda: Results.load(tmp_path / "results.json"), "results.json"),
                       (lambda: read_record(tmp_path / "mlflow.json"), "mlflow.json"),
                       (lambda: attempts.read_records(tmp_path), "attempts.jsonl"),
                       (lambda: ownership.read_owner(tmp_path / "checkpoints"), ownership.OWNER)]:
        said = as_nobody(call)
        assert said.startswith(f"error: {tmp_path}/") and f"{path}: permission denied (owner " \
               "root, mode 600)" in said, said
    assert json.loads((tmp_path / "results.json").read_text()) == {"job": "a"}   # nothing lost
