"""A shared MLflow file store (a site's tracking_uri: file:DIR, DIR mode 1777) works for every
user (issue 51, point 4): the experiments lock the first user makes is one every later user
can take, whatever the first user's umask; lint warns before the job when the store (or the
experiment's directory in it) is not writable by this user."""

import fcntl
import os

import pytest

from hpcsuite.runs.mlflow_run import LOCK, store_lock
from hpcsuite.submit.tracking import store_problem
from test_file_modes import as_nobody, open_dir  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as two users: run as root")


def take(store):
    def call():
        fd = store_lock(store)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        return "locked"
    return call


def test_every_user_takes_the_one_lock_whatever_the_first_users_umask(open_dir):
    store = open_dir / "mlruns"
    store.mkdir()
    os.chmod(store, 0o1777)
    old = os.umask(0o077)
    try:
        assert take(store)() == "locked"            # root first, with a private umask
    finally:
        os.umask(old)
    assert oct((store / LOCK).stat().st_mode & 0o777) == "0o644"
    assert as_nobody(take(store)) == "returned 'locked'"
    assert sorted(p.name for p in store.iterdir()) == [LOCK]      # the same lock, no other


def test_a_lock_this_user_cannot_open_falls_back_to_its_own(open_dir):
    store = open_dir / "mlruns"
    store.mkdir()
    os.chmod(store, 0o1777)
    (store / LOCK).touch(mode=0o600)
    os.chmod(store / LOCK, 0o600)                    # made by an older hpcsuite, umask 077
    assert as_nobody(take(store)) == "returned 'locked'"
    assert (store / f"{LOCK}.65534").is_file()


def test_lint_says_when_this_user_cannot_write_the_store(open_dir):
    store = open_dir / "shared"
    store.mkdir()
    os.chmod(store, 0o755)                           # root's: nobody cannot write it
    assert store_problem(f"file:{store}", "exp") is None          # root can
    said = as_nobody(lambda: store_problem(f"file:{store}", "exp"))
    assert f"the MLflow file store {store}: the store ({store}) is not writable by nobody" in said
    os.chmod(store, 0o1777)
    assert as_nobody(lambda: store_problem(f"file:{store}", "exp")) == "returned None"
    # an experiment of that name another user made, not writable by this one
    (store / "1").mkdir()
    os.chmod(store / "1", 0o755)
    (store / "1" / "meta.yaml").write_text("artifact_location: x\nexperiment_id: '1'\nname: exp\n")
    said = as_nobody(lambda: store_problem(f"file:{store}", "exp"))
    assert f"experiment 'exp''s directory ({store}/1) is not writable by nobody" in said, said
    assert as_nobody(lambda: store_problem(f"file:{store}", "other")) == "returned None"
    assert store_problem("http://mlflow:5000", "exp") is None
    assert as_nobody(lambda: store_problem(str(store / "new" / "deeper"), "exp")) == "returned None"
