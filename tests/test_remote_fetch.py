"""`hpcsuite fetch` (hpcsuite.remote.fetch): the pure parts (manifest, diff, batches, names,
layout) without ssh, and one end-to-end fetch through a private sshd (tests/sshd.py) from the
test account's home, when this machine can run one."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpcsuite.errors import UserError
from hpcsuite.remote.fetch import Source, manifest_script
from hpcsuite.remote.manifest import (CHECKPOINTS, ROOT, RUN, Layout, RemoteFile, batches,
                                      check_component, check_name, human, parse_manifest, wanted)

REPO = Path(__file__).resolve().parent.parent


def rf(part, name, size=1, mtime=1_700_000_000):
    return RemoteFile(part, name, size, mtime)


# ------------------------------------------------------------------- manifest
def test_manifest_records_are_nul_ended_and_names_may_hold_tabs_and_newlines():
    text = (b"run\tresults.json\t120\t1700000000.1234567890\0"
            b"run\tlogs/rank 0\twith\ttabs\nand newline.log\t5\t1700000001.0\0"
            b"root\tslurm-7.out\t33\t1700000002.9\0"
            b"checkpoints\tstep-00000010/model.bin\t4096\t1700000003.5\0")
    files = parse_manifest(text)
    assert files == [rf(RUN, "results.json", 120, 1700000000),
                     rf(RUN, "logs/rank 0\twith\ttabs\nand newline.log", 5, 1700000001),
                     rf(ROOT, "slurm-7.out", 33, 1700000002),
                     rf(CHECKPOINTS, "step-00000010/model.bin", 4096, 1700000003)]
    assert files[0].key == "run/results.json"
    assert parse_manifest(b"") == []


@pytest.mark.parametrize("name", ["../etc/passwd", "a/../../b", "/etc/passwd", "", "./a", "a//b",
                                  "a/./b", "a/"])
def test_a_name_that_is_absolute_empty_or_climbs_is_refused(name):
    with pytest.raises(UserError, match="refusing"):
        check_name(name)
    with pytest.raises(UserError):
        parse_manifest(f"run\t{name}\t1\t1.0\0".encode())


@pytest.mark.parametrize("name", ["results.json", "a..b", "..hidden", "logs/rank-0.log",
                                  "dir with space/f"])
def test_ordinary_names_pass(name):
    assert check_name(name) == name


def test_an_unknown_part_is_refused():
    with pytest.raises(UserError, match="unexpected"):
        parse_manifest(b"elsewhere\tx\t1\t1.0\0")


@pytest.mark.parametrize("value", ["..", ".", ".hidden", "a/b", "", "x" * 200, "a\nb"])
def test_job_name_and_id_must_be_one_plain_component(value):
    with pytest.raises(UserError):
        check_component(value, "the job name")


# ------------------------------------------------------------------- layout and diff
def test_local_layout_mirrors_output_dir_name_jobid(tmp_path):
    layout = Layout(tmp_path / "runs", "quickstart", "42")
    assert layout.run_dir == tmp_path / "runs/quickstart/42"
    assert layout.local(rf(RUN, "logs/rank-0.log")) == tmp_path / "runs/quickstart/42/logs/rank-0.log"
    assert layout.local(rf(ROOT, "slurm-42.out")) == tmp_path / "runs/quickstart/slurm-42.out"
    assert layout.local(rf(ROOT, "mlruns/1/meta.yaml")) == tmp_path / "runs/quickstart/mlruns/1/meta.yaml"
    assert layout.local(rf(CHECKPOINTS, "step-00000010/m.bin")) == \
        tmp_path / "runs/quickstart/checkpoints/step-00000010/m.bin"
    assert layout.staging.parent == tmp_path / "runs"    # same filesystem: os.replace works


def test_only_missing_or_changed_files_are_wanted(tmp_path):
    layout = Layout(tmp_path, "n", "1")
    same, resized, touched, missing, rewritten = (
        rf(RUN, "same", 3, 1000), rf(RUN, "resized", 3, 1000), rf(RUN, "touched", 3, 1000),
        rf(RUN, "missing", 3, 1000), rf(RUN, "mlflow.json", 3, 1000))
    layout.run_dir.mkdir(parents=True)
    for f, data, mtime in [(same, b"abc", 1000.7), (resized, b"abcd", 1000), (touched, b"abc", 999),
                           (rewritten, b"longer text", 5)]:
        path = layout.local(f)
        path.write_bytes(data)
        os.utime(path, (mtime, mtime))
    state = {"run/mlflow.json": [3, 1000]}          # what the last fetch copied before rewriting
    assert wanted([same, resized, touched, missing, rewritten], layout, state) == \
        [resized, touched, missing]
    # the remote's file changed since: copied again even though the state knew the old one
    assert wanted([rf(RUN, "mlflow.json", 4, 1001)], layout, state) == [rf(RUN, "mlflow.json", 4, 1001)]


def test_batches_hold_one_part_and_at_most_the_limit():
    files = [rf(RUN, "a", 40), rf(RUN, "b", 30), rf(RUN, "c", 30), rf(RUN, "huge", 500),
             rf(ROOT, "slurm-1.out", 1), rf(CHECKPOINTS, "x", 10)]
    got = batches(files, limit=64)
    assert [[f.name for f in b] for b in got] == [["x"], ["slurm-1.out"], ["a"], ["b", "c"],
                                                  ["huge"]]
    assert all(len({f.part for f in b}) == 1 for b in got)
    assert batches([]) == []


def test_the_manifest_script_lists_each_part_once():
    source = Source("/home/u/w/runs/job/7", "7", "job", checkpoints="/scratch/ck",
                    mlruns=["mlruns/1", "mlruns/1/abc"])
    script = manifest_script(source)
    assert script.startswith("(cd /home/u/w/runs/job/7 && find . ")
    assert "-maxdepth 1 -name slurm-7.out" in script
    assert "'.tmp-*'" in script and "-prune" in script
    assert script.count("-printf") == 5
    assert "'root\tmlruns/1/abc/%P\t%s\t%T@\\0'" in script
    assert "checkpoints" not in manifest_script(Source("/r/job/7", "7", "job"))


def test_human_sizes():
    assert human(0) == "0 B" and human(1234) == "1.2 kB" and human(1.2e6) == "1.2 MB"


def test_fetch_without_a_remote_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HPCSUITE_REMOTE"}
    proc = subprocess.run([sys.executable, "-m", "hpcsuite", "fetch", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--remote NAME is required" in proc.stderr


# ------------------------------------------------------------------- end to end
USER = "hpcuser"
COMMAND = f"/home/{USER}/venv-hpcsuite/bin/hpcsuite"


@pytest.fixture(scope="module")
def site():
    if os.geteuid() != 0:
        pytest.skip("starts sshd as root")
    if not (REPO / "tests" / "sshd.py").is_file():
        pytest.skip("no tests/sshd.py")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no account {USER}: scripts/test_account.sh --venv makes it")
    if not os.access(COMMAND, os.X_OK):
        pytest.skip(f"no {COMMAND}: scripts/test_account.sh --venv makes it")
    sys.path.insert(0, str(REPO / "tests"))
    from sshd import make_site

    base = Path(tempfile.mkdtemp(prefix="hs-f-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        with make_site(base / "site", USER) as made:
            yield base, made
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fake_run(home: Path, uid: int, gid: int) -> Path:
    """A run directory under the account's home: a real run's files when this machine kept
    one, its Slurm log, logs/rank-0.log and two checkpoints of 40 MiB each."""
    work = home / f"fetch-e2e-{os.getpid()}"
    run = work / "runs" / "quickstart" / "4242"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"status": "completed"}))
    _tracked(run)
    (run / "logs").mkdir(exist_ok=True)
    (run / "logs" / "rank-0.log").write_text("rank 0 says hello\n")
    (run.parent / "slurm-4242.out").write_text("the batch script's log\n")
    (run.parent / "slurm-9999.out").write_text("another job's log\n")
    (run / "escape").symlink_to("/etc")
    for step in (10, 20):
        ck = run.parent / "checkpoints" / f"step-{step:08d}"
        ck.mkdir(parents=True)
        (ck / "model.bin").write_bytes(os.urandom(40 << 20))
    (run.parent / "checkpoints" / ".tmp-step-00000030-h-1").mkdir()
    (run.parent / "checkpoints" / ".tmp-step-00000030-h-1" / "half").write_bytes(b"x")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(work)], check=True)
    return run


def _tracked(run: Path) -> None:
    """The run's MLflow run in the job name's file store (OUTPUT_DIR/NAME/mlruns), as rank 0
    logs it, with its mlflow.json: a parameter, a metric's history."""
    from hpcsuite.runs.mlflow_store import client_for, mlflow_environment, write_record

    uri = f"file://{run.parent / 'mlruns'}"
    with mlflow_environment():
        client = client_for(uri)
        experiment = client.create_experiment("quickstart")
        made = client.create_run(experiment, run_name="4242")
        client.log_param(made.info.run_id, "lr", "0.05")
        for step, loss in enumerate((2.3, 1.1, 0.7)):
            client.log_metric(made.info.run_id, "loss", loss, step=step)
        client.set_terminated(made.info.run_id)
    write_record(run / "mlflow.json", {"uri": uri, "run_id": made.info.run_id,
                                       "experiment": "quickstart", "experiment_id": experiment,
                                       "state": "ended", "status": "FINISHED"})


@pytest.mark.e2e
def test_fetch_end_to_end_resumable_and_recorded(site):
    base, made = site
    pw = pwd.getpwnam(USER)
    run = _fake_run(Path(pw.pw_dir), pw.pw_uid, pw.pw_gid)
    project = base / "project"
    project.mkdir()
    (base / "xdg" / "hpcsuite").mkdir(parents=True)
    (base / "run").mkdir(mode=0o700)
    (base / "xdg" / "hpcsuite" / "remotes.yaml").write_text(json.dumps({"hpc": {
        "host": "hpc-login", "workdir": f"~/hpcsuite-fetch-{os.getpid()}", "command": COMMAND,
        "ssh_options": ["-F", str(made.config)]}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCSUITE_"))}
    env.update(XDG_CONFIG_HOME=str(base / "xdg"), XDG_RUNTIME_DIR=str(base / "run"),
               SLURM_CONF="/nonexistent/slurm.conf", HPCSUITE_REMOTE="hpc")

    def hpcsuite(*args, expect=0):
        proc = subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == expect, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    local = project / "runs" / "quickstart" / "4242"
    try:
        first = hpcsuite("fetch", str(run))
        assert first.stdout.strip() == str(local)
        assert first.stderr.startswith("fetched ") and "0 already here" in first.stderr
        assert (local / "results.json").read_bytes() == (run / "results.json").read_bytes()
        assert (local / "logs" / "rank-0.log").read_text() == "rank 0 says hello\n"
        assert (local.parent / "slurm-4242.out").read_text() == "the batch script's log\n"
        assert not (local.parent / "slurm-9999.out").exists()
        assert not (local / "escape").exists()                  # symlinks are not followed
        assert not (local.parent / "checkpoints").exists()
        assert int((local / "results.json").stat().st_mtime) == \
            int((run / "results.json").stat().st_mtime)
        entries = [json.loads(line) for line in
                   (project / ".hpcsuite" / "runs.jsonl").read_text().splitlines()]
        assert [(e["job_id"], e["run_dir"], e["remote"], e["remote_run_dir"]) for e in entries] \
            == [("4242", str(local), "hpc", str(run))]

        # the copy's MLflow run reaches a store here (tracking sync, as into a laptop's server)
        assert (local.parent / "mlruns").is_dir()
        synced = json.loads(hpcsuite("tracking", "sync", "4242", "--to",
                                     f"sqlite:///{project / 'mine.db'}", "--json").stdout)
        assert [(d["added"], d["metrics"]) for d in synced] == [(True, 3)], synced

        again = json.loads(hpcsuite("fetch", str(run), "--json").stdout)
        assert again["copied"] == 0 and again["already"] == again["files"] and not again["recorded"]

        # interrupted in the middle of the checkpoints: no staging left, the rest next time
        proc = subprocess.Popen([sys.executable, "-m", "hpcsuite", "fetch", str(run),
                                 "--checkpoints"], cwd=project, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        staging = project / "runs" / ".fetch-partial-4242"
        deadline = time.monotonic() + 60
        while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 130), err
        print("interrupted fetch exit", proc.returncode, err.strip())
        assert not staging.exists()
        assert not list((project / "runs").glob(".fetch-partial-*"))

        last = json.loads(hpcsuite("fetch", str(run), "--checkpoints", "--json").stdout)
        assert last["files"] - last["already"] == last["copied"]
        ck = local.parent / "checkpoints"
        for step in (10, 20):
            name = f"step-{step:08d}/model.bin"
            assert (ck / name).read_bytes() == (run.parent / "checkpoints" / name).read_bytes()
        assert not (ck / ".tmp-step-00000030-h-1").exists()
        assert json.loads(hpcsuite("fetch", str(run), "--checkpoints", "--json").stdout)["copied"] == 0
        assert len((project / ".hpcsuite" / "runs.jsonl").read_text().splitlines()) == 1

        # a remote that fails: one line, exit 2, nothing left here
        bad = hpcsuite("fetch", str(run.parent / "77"), expect=2)
        assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: remote hpc")
        assert not (project / "runs" / "quickstart" / "77").exists()
    finally:
        shutil.rmtree(run.parents[2], ignore_errors=True)
        shutil.rmtree(Path(pw.pw_dir) / f"hpcsuite-fetch-{os.getpid()}", ignore_errors=True)
