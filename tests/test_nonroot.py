"""What lets an account that is not root use the local cluster and see why it cannot: the
cluster's files open to every account, its default place, and one line for a slurm.conf the
account cannot read (tests/test_e2e_nonroot.py runs jobs as such an account)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from conftest import as_account
from hpcsuite import slurm
from hpcsuite.site.cluster import DEFAULT_DIR, LocalCluster, closed_to_others, cluster_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cluster_lives_where_every_account_finds_it(monkeypatch):
    monkeypatch.delenv("HPCSUITE_CLUSTER_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/root/.local/state")   # root's: no longer used
    assert cluster_dir() == DEFAULT_DIR == Path("/var/lib/hpcsuite/cluster")
    monkeypatch.setenv("HPCSUITE_CLUSTER_DIR", "/srv/c")
    assert cluster_dir() == Path("/srv/c")


def test_what_accounts_read_is_open_to_them_whatever_roots_umask(tmp_path):
    root = tmp_path / "c"
    old = os.umask(0o077)
    try:
        c = LocalCluster(root, port=16000, accounting=False)
        c._prepare()
    finally:
        os.umask(old)
    assert c.munge_socket.parent == root / "run"          # not beside the key
    for d in (root, root / "etc", root / "etc" / "hpcsuite", root / "run", root / "log"):
        assert mode(d) == 0o755, d
    for f in (c.conf, c.profile):
        assert mode(f) == 0o644, f
    assert mode(root / "munge") == 0o700 and mode(root / "munge" / "munge.key") == 0o400
    assert f"AuthInfo=socket={root}/run/munge.socket.2" in c.conf.read_text()


def test_a_directory_closed_to_others_is_named(tmp_path):
    open_dir = tmp_path / "a" / "b"
    open_dir.mkdir(parents=True)
    for d in (tmp_path, tmp_path / "a", open_dir):
        d.chmod(0o755)
    assert closed_to_others(open_dir) in (None, *open_dir.parents)   # pytest's own may be 700
    (tmp_path / "a").chmod(0o700)
    found = closed_to_others(open_dir)
    assert found is not None and found in (tmp_path / "a", *tmp_path.parents)
    (tmp_path / "a").chmod(0o755)


def test_a_slurm_conf_the_account_cannot_read_is_one_line_naming_it():
    work = Path(tempfile.mkdtemp(prefix="hpcsuite-conf-"))
    try:
        work.chmod(0o755)
        readable, secret, closed = work / "ok.conf", work / "secret.conf", work / "closed"
        readable.write_text("ClusterName=x\n")
        readable.chmod(0o644)
        secret.write_text("ClusterName=x\n")
        secret.chmod(0o600)
        closed.mkdir(mode=0o700)
        (closed / "slurm.conf").write_text("ClusterName=x\n")
        problems = as_account(lambda: [slurm.conf_problem(str(p)) for p in
                                       (readable, secret, closed / "slurm.conf",
                                        work / "absent.conf")])
    finally:
        import shutil
        shutil.rmtree(work)
    fine, unreadable, unreachable, absent = problems
    assert fine is None
    assert unreadable.startswith(f"SLURM_CONF={secret}: this account cannot read it")
    assert unreachable.startswith(f"SLURM_CONF={closed}/slurm.conf: this account cannot reach it")
    assert absent.startswith(f"SLURM_CONF={work}/absent.conf: no such file")


def test_slurms_commands_are_not_run_with_a_conf_the_account_cannot_use(monkeypatch):
    ran = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(slurm, "conf_problem", lambda conf: f"SLURM_CONF={conf}: unreadable")
    with pytest.raises(slurm.UserError, match="SLURM_CONF=/x: unreadable"):
        slurm.call(["squeue"], env={"SLURM_CONF": "/x"})
    assert ran == []
