"""`--remote NAME` without a remote (issue 54): remotes.yaml's errors, which command line runs
where, which tokens are the files a command sends, what a spec's files are, and ssh's reasons.
The commands over a real sshd and the local cluster: tests/test_e2e_remote.py."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest

from conftest import run_cli
from hpcsuite.errors import UserError
from hpcsuite.remote import config, forward, send
from hpcsuite.remote.ssh import quote_dir, why


def remotes(work: Path, text: str) -> Path:
    path = work / "xdg" / "hpcsuite" / "remotes.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_remote_is_read_with_its_defaults(work):
    remotes(work, "hpc:\n  host: login.example.org\n  ssh_options: [-F, ~/cfg]\n")
    r = config.load("hpc")
    assert (r.name, r.host, r.workdir, r.command, r.persist) == \
        ("hpc", "login.example.org", "~/hpcsuite", "hpcsuite", 600)
    assert r.ssh_options == ["-F", os.path.expanduser("~/cfg")]


@pytest.mark.parametrize("text, name, says", [
    ("hpc:\n  hots: x\n", "hpc", 'remotes.yaml: hpc.hots: unknown key (did you mean "host"?)'),
    ("hpc:\n  host: -oProxyCommand=x\n", "hpc", "hpc.host: an SSH destination may not start"),
    ("hpc:\n  host: a b\n", "hpc", "hpc.host: an SSH destination has no spaces"),
    ("hpc:\n  host: x\n  persist: -1\n", "hpc", "hpc.persist"),
    ("hpc: [x]\n", "hpc", "remotes.yaml: hpc: expected a mapping"),
    ("hpc:\n  host: x\n", "hcp", "no remote named hcp (did you mean \"hpc\"?); remotes there: hpc"),
    ("hpc:\n  workdir: /w\n", "hpc", "hpc.host: required key is missing"),
])
def test_a_bad_remotes_file_is_one_line_naming_the_file_and_key(work, text, name, says):
    remotes(work, text)
    with pytest.raises(UserError) as e:
        config.load(name)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_no_remotes_file_says_where_it_is_looked_for(work):
    proc = run_cli("status", "12", "--remote", "hpc", cwd=work, env=dict(os.environ))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {work}/xdg/hpcsuite/remotes.yaml: no such file: name the "
                           "remote hpc there (host, workdir, command; docs/howto/laptop.md)\n")


def test_commands_that_do_not_talk_to_slurm_refuse_remote(work):
    proc = run_cli("cluster", "status", "--remote", "hpc", cwd=work, env=dict(os.environ))
    assert proc.returncode == 2 and "hpcsuite cluster runs here only" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_hpcsuite_remote_in_the_environment_reaches_only_slurm_commands(work, monkeypatch):
    monkeypatch.setenv("HPCSUITE_REMOTE", "hpc")
    assert forward.wanted(["status", "12"]) == ("hpc", ("status",), ["12"])
    assert forward.wanted(["sweep", "status", "d"]) == ("hpc", ("sweep", "status"), ["d"])
    assert forward.wanted(["templates", "list"]) is None        # runs here, as without it
    assert forward.wanted(["status", "--help"]) is None           # help is this machine's
    assert forward.wanted(["fetch", "12"]) is None                 # fetch has its own --remote


def test_the_remote_option_is_taken_out_wherever_it_is():
    assert forward.wanted(["-v", "submit", "a.yaml", "--remote=x", "--wait"]) == \
        ("x", ("submit",), ["a.yaml", "--wait"])
    assert forward.wanted(["study", "run", "--remote", "x", "s.yaml"]) == \
        ("x", ("study", "run"), ["s.yaml"])
    with pytest.raises(UserError, match="--remote needs the name"):
        forward.wanted(["status", "1", "--remote"])
    assert forward.wanted(["study", "rerun", "d", "--remote", "x"]) == \
        ("x", ("study", "rerun"), ["d"])
    assert forward.wanted(["bench", "allreduce", "--remote", "x", "--nodes", "2"]) == \
        ("x", ("bench", "allreduce"), ["--nodes", "2"])
    with pytest.raises(UserError, match="study compare runs here only"):
        forward.wanted(["study", "compare", "a", "b", "--remote", "x"])
    assert forward.wanted(["-v", "--remote", "x", "runs"]) == ("x", ("runs",), [])
    # a command hpcsuite does not have is click's to name, not "runs here only"
    assert forward.wanted(["sbumit", "a.yaml", "--remote", "x"], lambda w: False) is None


def test_a_mistyped_command_with_remote_is_named_as_without_it(work):
    proc = run_cli("sbumit", "a.yaml", "--remote", "x", cwd=work, env=dict(os.environ))
    assert proc.returncode == 2 and "No such command 'sbumit'" in proc.stderr


def _submit_command() -> click.Command:
    from hpcsuite.cli import main

    ctx = click.Context(main)
    return forward._command(ctx, ("submit",))


def test_tokens_find_the_spec_and_the_option_values():
    t = forward.Tokens(_submit_command(), ["--set", "a=b.yaml", "job.yaml", "--profile=p.yaml",
                                           "--wait", "--timeout", "30"])
    assert [t.tokens[i] for i in t.positional] == ["job.yaml"]
    assert t.get("--set") == ["a=b.yaml"] and t.value("--profile") == "p.yaml"
    t.replace("--profile", lambda v: "/there/" + v)
    t.drop("--wait", flag=True)
    t.drop("--timeout")
    assert t.tokens == ["--set", "a=b.yaml", "job.yaml", "--profile=/there/p.yaml"]


def test_a_spec_sends_what_it_names_and_nothing_else(work):
    (work / "code").mkdir()
    (work / "code" / "model.py").write_text("def build(s, c): ...\n")
    (work / "code" / "helpers.py").write_text("X = 1\n")
    (work / "data").mkdir()
    (work / "data" / "train.h5").write_bytes(b"h5")
    (work / "lib" / "pkg").mkdir(parents=True)
    (work / "lib" / "pkg" / "__init__.py").write_text("")
    (work / "runs" / "old").mkdir(parents=True)
    (work / "runs" / "old" / "results.json").write_text("{}")
    (work / "code" / "notes.txt").write_text("private\n")
    (work / "notes.txt").write_text("private\n")
    (work / ".hpcsuite").mkdir()
    (work / ".hpcsuite" / "profile.yaml").write_text("partition: x\n")
    (work / ".hpcsuite" / "runs.jsonl").write_text("")
    (work / "job.yaml").write_text(
        "name: j\ntrain:\n  model: code/model.py:build\n  data: {kind: hdf5, path: data/train.h5}\n"
        "  pythonpath: [lib]\n  loss: pkg.losses:mine\n")
    bundle = send.collect("job.yaml")
    assert sorted(bundle.relative(p) for p in bundle.files) == [
        ".hpcsuite/profile.yaml", "code/helpers.py", "code/model.py", "data/train.h5",
        "job.yaml", "lib/pkg/__init__.py"]
    assert bundle.root == work


def test_paths_above_the_submit_directory_keep_their_place_and_absolute_ones_stay(work):
    sub = work / "project"
    sub.mkdir()
    (work / "shared").mkdir()
    (work / "shared" / "data.h5").write_bytes(b"x")
    (sub / "job.yaml").write_text("name: j\ntrain:\n  data: {kind: hdf5, path: ../shared/data.h5}\n"
                                  "  script: /opt/site/train.py\n")
    os.chdir(sub)
    bundle = send.collect("job.yaml")
    assert bundle.root == work
    assert sorted(bundle.relative(p) for p in bundle.files) == ["project/job.yaml",
                                                                "shared/data.h5"]
    assert bundle.notes == ["train.script: /opt/site/train.py is absolute: the cluster's own "
                            "path, not sent"]


def test_a_sweep_sends_its_base_spec_and_a_set_changes_what_is_sent(work):
    (work / "a.py").write_text("def f(s, c): ...\n")
    (work / "b").mkdir()
    (work / "b" / "b.py").write_text("def f(s, c): ...\n")
    (work / "b" / "b.csv").write_text("1,2\n")
    (work / "job.yaml").write_text("name: j\ntrain:\n  model: a.py:f\n")
    (work / "sweep.yaml").write_text("name: s\nbase: job.yaml\naxes: {train.lr: [0.1]}\n")
    b = send.collect("sweep.yaml")
    assert sorted(b.relative(p) for p in b.files) == ["a.py", "b/b.py", "job.yaml", "sweep.yaml"]
    b = send.collect("job.yaml", sets=["train.model=b/b.py:f"])
    assert sorted(b.relative(p) for p in b.files) == ["b/b.py", "job.yaml"]


def test_an_executable_file_is_another_object_than_the_same_bytes_not_executable(work):
    (work / "a").write_text("same\n")
    (work / "b").write_text("same\n")
    os.chmod(work / "b", 0o755)
    assert send._object(work / "b") == send._object(work / "a") + "x"


@pytest.mark.parametrize("stderr, line", [
    ("ssh: connect to host 127.0.0.1 port 1: Connection refused\r\n",
     "ssh: connect to host 127.0.0.1 port 1: Connection refused"),
    ("channel 0: open failed: connect failed: Connection refused\nstdio forwarding failed\n"
     "Connection closed by UNKNOWN port 65535\n",
     "channel 0: open failed: connect failed: Connection refused"),
    ("hpcuser@127.0.0.1: Permission denied (publickey).\n",
     "hpcuser@127.0.0.1: Permission denied (publickey)."),
    ("", "ssh failed without saying why"),
])
def test_the_line_that_says_why_ssh_failed(stderr, line):
    assert why(stderr) == line


def test_a_remote_directory_keeps_its_tilde_for_the_remote_shell():
    assert quote_dir("~/hpc suite") == "~/'hpc suite'"
    assert quote_dir("/scratch/$x") == "'/scratch/$x'"


class Dropped:
    """A connection whose every command is cut and that never comes back."""

    def __init__(self):
        from hpcsuite.remote.config import Remote

        self.remote = Remote(host="login", name="hpc")
        self.opened = 0

    def where(self):
        return "remote hpc (login)"

    def in_workdir(self, line, **kw):
        return line

    def hpcsuite(self, args):
        return " ".join(args)

    def run(self, *a, **kw):
        from hpcsuite.remote.ssh import Lost

        raise Lost(self.where(), "Connection reset by peer")

    def open(self):
        from hpcsuite.remote.ssh import RemoteError

        self.opened += 1
        raise RemoteError("no route")


def test_a_follow_whose_connection_never_comes_back_says_how_to_follow_again(monkeypatch):
    monkeypatch.setattr(forward, "RECONNECT_S", 0.2)
    monkeypatch.setattr(forward.time, "sleep", lambda s: None)
    conn = Dropped()
    with pytest.raises(UserError) as e:
        forward.follow(conn, "77", "/w", None, as_json=False)
    assert str(e.value) == ("remote hpc (login): the connection did not come back in 0.2 s; job 77 "
                            "keeps running there: `hpcsuite status 77 --wait --remote hpc` "
                            "follows it again")
    assert conn.opened >= 1


def test_the_version_is_asked_once_per_master_connection(tmp_path):
    from hpcsuite import __version__
    from hpcsuite.remote.config import Remote

    class Known:
        remote = Remote(host="login", name="hpc", workdir="~/w", command="hpcsuite")
        master = "4321"

        def remembered(self):
            return tmp_path / "checked"

        def hpcsuite(self, args):
            return "hpcsuite " + " ".join(args)

        def run(self, *a, **kw):
            raise AssertionError("asked again over the same connection")

    (tmp_path / "checked").write_text(f"4321 {__version__} ~/w hpcsuite\n/home/u/w\n")
    assert forward.check_version(Known()) == "/home/u/w"
    Known.master = "9999"                     # another connection: asked again
    with pytest.raises(AssertionError, match="asked again"):
        forward.check_version(Known())


def test_after_a_lost_connection_a_command_that_changes_things_is_looked_at_first():
    assert "may have been submitted: `hpcsuite runs --remote hpc`" in \
        forward._after_loss(("submit",), "hpc")
    assert "before you run the sweep again" in forward._after_loss(("sweep", "run"), "hpc")
    assert forward._after_loss(("status",), "hpc") == "nothing was changed there by it: run it again"


def test_the_socket_directory_is_private_and_short_enough_for_a_socket(tmp_path, monkeypatch):
    from hpcsuite.remote.ssh import socket_dir

    import shutil
    import tempfile

    short_base = Path(tempfile.mkdtemp(prefix="s-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_base))
    made = socket_dir()
    assert made == short_base / "hpcsuite" / "ssh" and made.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(short_base)
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    short = socket_dir()
    assert len(str(short)) + 50 < 104 and short.stat().st_mode & 0o777 == 0o700


def test_a_digest_is_taken_again_only_when_the_file_changed(tmp_path, monkeypatch):
    data = tmp_path / "big.npy"
    data.write_bytes(b"x" * 1000)
    known: dict = {}
    first = send._object(data, known)
    monkeypatch.setattr(send, "digest", lambda p: (_ for _ in ()).throw(AssertionError("read")))
    assert send._object(data, known) == first                  # size and mtime unchanged
    data.write_bytes(b"y" * 1001)
    with pytest.raises(AssertionError, match="read"):
        send._object(data, known)


def _lay_out(workdir: Path, stream: bytes):
    import subprocess

    (workdir / ".hpcsuite" / "objects").mkdir(parents=True, exist_ok=True)
    (workdir / "jobs").mkdir(exist_ok=True)
    return subprocess.run(["sh", "-c", send._LAY_OUT.format(workdir=workdir, label="job-1")],
                          input=stream, capture_output=True)


def test_the_remote_lays_out_a_whole_stream_and_nothing_of_one_cut_short(tmp_path):
    import io

    (tmp_path / "code").mkdir()
    model = tmp_path / "code" / "model.py"
    model.write_text("def build(s, c): ...\n")
    name = send._object(model)
    whole, cut = io.BytesIO(), io.BytesIO()
    send._write_tar(whole, [(name, "code/model.py"), (name, "again.py")], [(name, model)])
    there = tmp_path / "there"
    done = _lay_out(there, whole.getvalue())
    assert done.returncode == 0, done.stderr
    job = there / "jobs" / "job-1"
    assert (job / "code" / "model.py").read_text() == model.read_text()
    assert (job / "code" / "model.py").stat().st_ino == (job / "again.py").stat().st_ino
    assert not (job / "again.py").stat().st_mode & 0o222                  # read-only objects

    # a file that changed after its digest was taken: refused, the stream has no manifest
    model.write_text("def build(s, c): return 1\n")
    with pytest.raises(UserError, match="changed while it was being sent"):
        send._write_tar(cut, [(name, "code/model.py")], [(name, model)])
    other = tmp_path / "other"
    done = _lay_out(other, cut.getvalue())
    assert done.returncode != 0 and b"ended before its manifest" in done.stderr
    assert list((other / "jobs").iterdir()) == []
    assert list((other / ".hpcsuite" / "objects").iterdir()) == []
    assert [p.name for p in (other / ".hpcsuite").iterdir()] == ["objects"]
