"""Every Slurm command from a laptop over SSH (issue 54), end to end on this machine: root is
the laptop (its own key, ssh_config, remotes.yaml, no Slurm of its own: SLURM_CONF points
nowhere), two Debian sshd started by the test (tests/sshd.py) are the site's jump host and
login node, the unprivileged account hpcuser (its own home, its own venv of this checkout:
scripts/test_account.sh) is the user there, and the shared wide cluster is behind it.

- a job submitted with --wait through the jump host: only the files its spec names are sent,
  by content (a second command sends none), the connection is cut while the job runs and the
  follow reconnects, status/runs/logs/report answer there, fetch brings the run back and
  status and report read the copy here;
- sweep and study run (dry runs: their base specs sent), lint, and doctor against that Slurm;
- what goes wrong between here and there is one line, exit 2: another hpcsuite version, none,
  an unreachable host, a refused key, a full remote disk (nothing half-written left), a remote
  command that fails.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

USER = "hpcuser"

MODEL = '''\
import torch

from helpers import WIDTH


def build(input_shape, classes):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[-1], WIDTH),
                               torch.nn.ReLU(), torch.nn.Linear(WIDTH, classes))
'''

JOB = """\
name: laptop
resources: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: "00:10:00", partition: debug}
train:
  model: code/model.py:build
  pythonpath: [code]
  data: {kind: synthetic, samples: 4096, shape: [16], classes: 4}
  batch_size: 64
  epochs: 2
"""


class Laptop:
    """Root as a laptop: its ssh_config, remotes.yaml and control sockets in a directory of its
    own, no Slurm (SLURM_CONF names no file), hpcsuite from this checkout."""

    def __init__(self, base: Path, site, workdir: str, command: str, small: Path):
        self.base, self.site, self.small = base, site, small
        self.project = base / "project"
        self.project.mkdir()
        config = base / "xdg" / "hpcsuite"
        config.mkdir(parents=True)
        (base / "run").mkdir(mode=0o700)
        ssh = ["-F", str(site.config)]
        entries = {
            "hpc": {"host": "hpc-login", "workdir": workdir, "command": command,
                    "ssh_options": ssh},
            "old": {"host": "hpc-login", "workdir": workdir,
                    "command": "/home/hpcuser/old-hpcsuite", "ssh_options": ssh},
            "none": {"host": "hpc-login", "workdir": workdir, "command": "/nonexistent/hpcsuite",
                     "ssh_options": ssh},
            "nowhere": {"host": "hpc-nowhere", "workdir": workdir, "ssh_options": ssh},
            "badkey": {"host": "hpc-badkey", "workdir": workdir, "ssh_options": ssh},
            "full": {"host": "hpc-direct", "workdir": str(small), "command": command,
                     "ssh_options": ssh},
        }
        (config / "remotes.yaml").write_text(json.dumps(entries, indent=1))
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "HPCSUITE_"))}
        self.env.update(XDG_CONFIG_HOME=str(base / "xdg"), XDG_RUNTIME_DIR=str(base / "run"),
                        SLURM_CONF="/nonexistent/slurm.conf",
                        HPCSUITE_SITE_DIR=str(base / "no-site"))

    def hpcsuite(self, *args: str, expect: int | None = 0, timeout: float = 600, **kw):
        proc = subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=self.project,
                              env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if expect is not None:
            assert proc.returncode == expect, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def cut(self) -> None:
        """The shared connection to the login node ends, as a dropped link ends it."""
        for socket in (self.base / "run" / "hpcsuite" / "ssh").iterdir():
            subprocess.run(["ssh", "-F", str(self.site.config), "-o", f"ControlPath={socket}",
                            "-O", "exit", "hpc-login"], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def laptop(account, wide_cluster):
    from conftest import cancel_all
    from sshd import make_site, small_disk

    pw, venv = account
    base = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))      # short: socket paths
    os.chmod(base, 0o755)
    workdir = f"remote-tests-{os.getpid()}"
    env = {**wide_cluster.client_env(), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    command = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + \
        f" {venv}/bin/hpcsuite"
    old = Path(pw.pw_dir) / "old-hpcsuite"
    old.write_text("#!/bin/sh\necho 'hpcsuite, version 0.0.9'\n")
    os.chmod(old, 0o755)
    small = Path(pw.pw_dir) / f"small-{os.getpid()}"
    site = make_site(base / "site", USER)
    try:
        with small_disk(small, "1m", uid=pw.pw_uid):
            yield Laptop(base, site, f"~/{workdir}", command, small)
    finally:
        site.stop()
        cancel_all(wide_cluster)
        shutil.rmtree(Path(pw.pw_dir) / workdir, ignore_errors=True)
        old.unlink(missing_ok=True)
        shutil.rmtree(small, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_job_from_a_laptop_runs_there_is_followed_across_a_cut_and_comes_back(laptop, account):
    pw, _ = account
    p = laptop.project
    (p / "code").mkdir()
    (p / "code" / "model.py").write_text(MODEL)
    (p / "code" / "helpers.py").write_text("WIDTH = 24\n")
    (p / "notes.txt").write_text("not named by the spec\n")
    (p / "big.bin").write_bytes(os.urandom(1 << 20))
    (p / "job.yaml").write_text(JOB)

    # submit --wait through the jump host; the connection is cut once the job is followed
    proc = subprocess.Popen([sys.executable, "-m", "hpcsuite", "submit", "job.yaml", "--remote",
                             "hpc", "--wait"], cwd=p, env=laptop.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not any("submitted job" in line for line in out) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(4)
    laptop.cut()
    err = proc.stderr.read()
    assert proc.wait(timeout=600) == 0, "".join(out) + err
    reader.join(10)
    stdout = "".join(out)
    job_id = stdout.split("submitted job ", 1)[1].split(";")[0]
    assert "sent 3 of 3 file(s)" in err and "(0 already there)" in err, err
    assert "lost the connection to remote hpc (hpc-login)" in err and "connecting again" in err
    assert "completed" in stdout.lower()

    # only what the spec names was sent, by content, into a job directory of its own there
    jobs = sorted(Path(pw.pw_dir).glob("remote-tests-*/jobs/*"))
    assert len(jobs) == 1 and not jobs[0].name.startswith(".")
    sent = sorted(str(f.relative_to(jobs[0])) for f in jobs[0].rglob("*") if f.is_file()
                  and not {"runs", "__pycache__"} & set(f.relative_to(jobs[0]).parts))
    assert sent == ["code/helpers.py", "code/model.py", "job.yaml"], sent
    objects = list(jobs[0].parent.parent.glob(".hpcsuite/objects/*"))
    assert len(objects) == 3 and all(o.stat().st_uid == pw.pw_uid for o in objects)

    # a second command sends nothing new
    render = laptop.hpcsuite("render", "job.yaml", "--remote", "hpc")
    assert "sent 0 of 3 file(s), 0 B of" in render.stderr and "(3 already there)" in render.stderr
    assert "#SBATCH" in render.stdout

    # status, runs, logs and report answer there, from the remote working directory
    state = json.loads(laptop.hpcsuite("status", job_id, "--remote", "hpc", "--json").stdout)
    assert state["state"] == "COMPLETED" and state["run_dir"].startswith(pw.pw_dir)
    assert job_id in laptop.hpcsuite("runs", "--remote", "hpc").stdout
    laptop.hpcsuite("logs", job_id, "--remote", "hpc")
    laptop.hpcsuite("report", job_id, "--remote", "hpc")
    again = laptop.hpcsuite("status", job_id, "--wait", "--remote", "hpc")
    assert "completed" in again.stdout.lower()
    # on a terminal, the follow is the live line, through ssh's terminal, and its exit status
    code, shown = in_a_terminal(laptop, "status", job_id, "--wait", "--remote", "hpc")
    assert code == 0 and b"\r\x1b[K" in shown and f"job {job_id}: ".encode() in shown, shown

    # fetch brings the run back; status and report read the copy, with no Slurm here
    fetched = laptop.hpcsuite("fetch", job_id, "--remote", "hpc")
    copy = p / fetched.stdout.strip().splitlines()[-1]
    assert (copy / "results.json").is_file() and (copy / "job.json").is_file()
    assert json.loads((copy / "results.json").read_text())["status"] == "completed"
    assert "fetched 0 files" in laptop.hpcsuite("fetch", job_id, "--remote", "hpc").stderr
    here = laptop.hpcsuite("status", job_id)
    assert "completed" in here.stdout.lower()
    laptop.hpcsuite("report", job_id)

    # a full disk here: one line, and nothing half-written in the copy's place
    from sshd import small_disk

    tiny = laptop.base / "tiny"
    with small_disk(tiny, "16k"):
        line = one_line(laptop.hpcsuite("fetch", job_id, "--remote", "hpc", "--to", str(tiny),
                                        expect=None))
        assert "no space left on the device" in line, line
        assert not list(tiny.glob(".fetch-partial-*"))       # no staging left behind
        for kept in tiny.rglob("*"):                           # what stayed arrived whole
            if kept.is_file() and kept.name != ".fetched.json":
                twin = copy.parent / kept.relative_to(tiny / copy.parent.name)
                assert kept.read_bytes() == twin.read_bytes(), kept

    # the control socket's directory is the user's alone
    assert (laptop.base / "run" / "hpcsuite" / "ssh").stat().st_mode & 0o777 == 0o700


def test_sweep_study_lint_and_doctor_run_there_and_send_the_base_spec(laptop):
    p = laptop.project
    (p / "sweep").mkdir()
    (p / "sweep" / "base.yaml").write_text(JOB.replace("code/model.py:build", "mlp")
                                           .replace("  pythonpath: [code]\n", ""))
    (p / "sweep" / "lr.yaml").write_text("name: lr\nbase: base.yaml\naxes: {train.lr: [0.01, 0.1]}\n")
    (p / "sweep" / "study.yaml").write_text("name: st\nbase: base.yaml\nmode: weak\n"
                                            "axes: {nodes: [1, 2]}\nsteps: 5\n")
    swept = laptop.hpcsuite("sweep", "run", "sweep/lr.yaml", "--dry-run", "--remote", "hpc")
    assert "# element 1: --set train.lr=0.1" in swept.stdout and "sent 2 of 2" in swept.stderr
    studied = laptop.hpcsuite("study", "run", "sweep/study.yaml", "--dry-run", "--remote", "hpc")
    assert "sent 1 of 2 file(s)" in studied.stderr, studied.stderr     # base.yaml was there
    linted = laptop.hpcsuite("lint", "sweep/lr.yaml", "--remote", "hpc")
    assert "ok" in linted.stdout
    # doctor asks the cluster's Slurm, there (here SLURM_CONF names no file)
    doctor = laptop.hpcsuite("doctor", "--no-compute", "--json", "--remote", "hpc", expect=None)
    checks = {c["name"]: c["status"] for c in json.loads(doctor.stdout)}
    assert checks["slurm"] == "pass", doctor.stdout


def in_a_terminal(laptop: Laptop, *args: str) -> tuple[int, bytes]:
    """`hpcsuite ARGS` with a terminal for its stdin, stdout and stderr: (exit status, what
    it showed)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:       # the child: the command, in the project, with the laptop's environment
        os.chdir(laptop.project)
        os.execve(sys.executable, [sys.executable, "-m", "hpcsuite", *args], laptop.env)
    shown = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:     # EIO: the child's side closed
            break
        if not chunk:
            break
        shown += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), shown


def one_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_what_goes_wrong_between_here_and_there_is_one_line(laptop, account):
    pw, _ = account
    p = laptop.project
    (p / "wrong").mkdir(exist_ok=True)
    line = one_line(laptop.hpcsuite("runs", "--remote", "old", expect=None))
    from hpcsuite import __version__

    assert f"runs hpcsuite 0.0.9, this is hpcsuite {__version__}" in line
    assert "no hpcsuite there" in one_line(laptop.hpcsuite("runs", "--remote", "none", expect=None))
    assert "Connection refused" in one_line(laptop.hpcsuite("runs", "--remote", "nowhere",
                                                            expect=None))
    assert "Permission denied (publickey)" in one_line(
        laptop.hpcsuite("runs", "--remote", "badkey", expect=None))
    assert "error: " in laptop.hpcsuite("status", "99999999", "--remote", "hpc",
                                        expect=2).stderr
    # a path a forwarded command takes is the cluster's: the remote says it has no such one
    line = one_line(laptop.hpcsuite("study", "rerun", "studies/nowhere", "--remote", "hpc",
                                    expect=None))
    assert "studies/nowhere" in line

    # a full remote disk: nothing of the job is left there
    (p / "wrong" / "big.npy").write_bytes(os.urandom(2 << 20))
    (p / "wrong" / "job.yaml").write_text(JOB.replace("code/model.py:build", "mlp")
                                          .replace("  pythonpath: [code]\n", "")
                                          .replace("{kind: synthetic, samples: 4096, shape: [16], "
                                                   "classes: 4}", "{kind: npy, path: wrong}"))
    line = one_line(laptop.hpcsuite("submit", "wrong/job.yaml", "--remote", "full", expect=None))
    assert "No space left on device" in line and "nothing of this job was left there" in line
    assert [d.name for d in (laptop.small / "jobs").iterdir()] == []
    assert [d.name for d in (laptop.small / ".hpcsuite").iterdir()] == ["objects"]
