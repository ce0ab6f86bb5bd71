"""Jobs of an account that is not root (issue 43 point 1), end to end on a local cluster that
root starts and every account uses: `hpcuser` (scripts/test_account.sh) submits with its own
venv (Debian's python3.11, hpcsuite from a wheel, the cached Horovod wheel) through `runuser`
with an environment of its own, never root's Python or the repository.

- the quickstart and, at the same time on the same nodes, a job of root's: each ran as its
  submitter (every rank's uid, the files it wrote), without OMPI_ALLOW_RUN_AS_ROOT in the
  ranks' environment of the user's job;
- a preempted and requeued job resumes from checkpoints the user owns;
- a sweep (one job array) and a study point run as the user;
- a site profile the user can read but not write holds its locks against the user's own
  profile, the project's and the command line; a cluster config the user cannot read is one
  line naming SLURM_CONF.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

USER = "hpcuser"

# A data factory that says, from inside each rank, who the rank runs as.
WHO = '''\
import os
import numpy as np


class Data:
    classes = 4

    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 16)).astype("f4")
        self.y = rng.integers(0, 4, n)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, ids):
        return self.x[ids], self.y[ids]


def make(n, out):
    allowed = sorted(k for k in os.environ if k.startswith("OMPI_ALLOW_RUN_AS_ROOT"))
    with open(out, "a") as f:
        f.write(f"{os.getuid()} {os.geteuid()} {os.environ.get('SLURM_RESTART_COUNT', '0')} "
                f"{','.join(allowed) or '-'}\\n")
    return Data(n)
'''


@pytest.fixture(scope="module")
def cluster(account, wide_cluster):
    """The session's wide cluster: two cores a node (declared as GPUs), so a job of root's and
    one of the user's share a node; its directory is reachable by the account."""
    from conftest import cancel_all

    yield wide_cluster
    cancel_all(wide_cluster)


class Account:
    """hpcuser's shell: its venv first on PATH, the cluster's env, nothing of root's."""

    def __init__(self, pw, venv: Path, cluster, umask: int | None = None):
        self.pw, self.venv, self.cluster, self.umask = pw, venv, cluster, umask

    def env(self, **extra) -> dict:
        name = self.pw.pw_name
        return {"HOME": self.pw.pw_dir, "USER": name, "LOGNAME": name, "LANG": "C.UTF-8",
                "PATH": f"{self.venv}/bin:/usr/bin:/bin", **self.cluster.client_env(), **extra}

    def run(self, *argv: str, cwd: Path, timeout: float = 900, **extra) -> subprocess.CompletedProcess:
        pairs = [f"{k}={v}" for k, v in self.env(**extra).items() if v is not None]
        if self.umask is not None:     # as the account's login shell would set it
            argv = ("sh", "-c", f'umask {self.umask:03o} && exec "$@"', "sh", *argv)
        return subprocess.run(["runuser", "-u", self.pw.pw_name, "--", "env", "-i", *pairs, *argv],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)

    def hpcsuite(self, *args: str, cwd: Path, expect: int | None = 0, **kw):
        proc = self.run("hpcsuite", *args, cwd=cwd, **kw)
        if expect is not None:
            assert proc.returncode == expect, f"{args}: {proc.stdout}\n{proc.stderr}"
        return proc

    def workdir(self, name: str) -> Path:
        path = Path(self.pw.pw_dir) / "nonroot-tests" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        for p in (path.parent, path):
            os.chown(p, self.pw.pw_uid, self.pw.pw_gid)
        return path

    def write(self, path: Path, text: str) -> Path:
        path.write_text(text)
        os.chown(path, self.pw.pw_uid, self.pw.pw_gid)
        return path


@pytest.fixture(scope="module")
def user(account, cluster):
    return Account(*account, cluster)


def root_env(cluster) -> dict:
    return dict(os.environ, **cluster.client_env(), HPCSUITE_CLUSTER_DIR=str(cluster.root))


def owners(paths) -> set[int]:
    return {p.stat().st_uid for p in paths}


def who(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()]


def spec(name: str, out: Path, epochs: int, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        name: {name}
        launcher: mpirun
        resources: {{nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: "00:10:00"}}
        train:
          model: mlp
          data: {{kind: python, factory: who.py:make, args: {{n: 512, out: {out}}}}}
          batch_size: 16
          epochs: {epochs}
          lr: 0.05
        """) + extra


def test_the_quickstart_and_a_job_of_roots_share_the_nodes_each_as_its_user(user, cluster):
    uid = user.pw.pw_uid
    work = user.workdir("quickstart")
    # The account finds root's cluster as the docs say, and Slurm answers it.
    shell = user.run("sh", "-c", 'eval "$(hpcsuite cluster env)" && sinfo -h -o %P '
                     '&& cat "$HPCSUITE_PROFILE" >/dev/null', cwd=work,
                     HPCSUITE_CLUSTER_DIR=str(cluster.root), SLURM_CONF=None, HPCSUITE_PROFILE=None)
    assert shell.returncode == 0 and "debug*" in shell.stdout, shell.stderr
    user.write(work / "who.py", WHO)
    user.write(work / "quickstart.yaml", (REPO / "sbatch" / "quickstart.yaml").read_text())
    user.write(work / "mine.yaml", spec("mine", work / "who-mine.txt", epochs=40))
    # root's job, in a directory only root can enter
    theirs = Path(tempfile.mkdtemp(prefix="hpcsuite-nonroot-root-", dir="/tmp"))
    (theirs / "who.py").write_text(WHO)
    (theirs / "job.yaml").write_text(spec("roots", theirs / "who-root.txt", epochs=40))
    renv = root_env(cluster)
    try:
        mine = user.hpcsuite("submit", "mine.yaml", cwd=work).stdout.strip().splitlines()[-1]
        root_job = run_cli("submit", "job.yaml", cwd=theirs, env=renv, check=True)
        root_job = root_job.stdout.strip().splitlines()[-1]
        # Both running at once, on the same two nodes.
        deadline, together = time.monotonic() + 240, False
        while time.monotonic() < deadline and not together:
            out = subprocess.run(["squeue", "-h", "-o", "%i %T %u %N"], env=renv,
                                 capture_output=True, text=True, check=True).stdout
            rows = {r.split()[0]: r.split()[1:] for r in out.splitlines()}
            together = all(rows.get(j, [""])[0] == "RUNNING" for j in (mine, root_job))
            time.sleep(0.3)
        assert together, out
        assert rows[mine][1] == USER and rows[root_job][1] == "root"
        assert rows[mine][2] == rows[root_job][2] == "node[1-2]"
        # The quickstart, as written, with --wait, while both run.
        proc = user.hpcsuite("submit", "quickstart.yaml", "--wait", "--json", cwd=work)
        payload = json.loads(proc.stdout)
        assert payload["state"] == "COMPLETED" and payload["results"]["world_size"] == 2
        for job, cwd, env in ((mine, work, None), (root_job, theirs, renv)):
            state = follow(user, cluster, job, cwd, env)
            assert state["state"] == "COMPLETED", state
        roots = who(theirs / "who-root.txt")
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
    run = Path(payload["run_dir"])
    assert run.is_relative_to(work)
    made = [p for p in run.rglob("*")]
    assert made and owners([run, *made]) == {uid}, "a file of the user's run is not the user's"
    # Inside every rank: the user's uid, and no allowance to run MPI as root.
    assert who(work / "who-mine.txt") == [[str(uid), str(uid), "0", "-"]] * 2
    # The control: root's ranks are root's, and the cluster's TaskProlog allows them mpirun.
    assert roots == [["0", "0", "0", "OMPI_ALLOW_RUN_AS_ROOT,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]] * 2


def follow(user, cluster, job: str, cwd: Path, env: dict | None = None, timeout: float = 600):
    """`status JOB --json` (as whoever submitted it) until the job ends; a requeued job is
    started as soon as both nodes are idle (not after Slurm's ~2 min hold)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if env is None:
            state = json.loads(user.hpcsuite("status", job, "--json", cwd=cwd).stdout)
        else:
            state = json.loads(run_cli("status", job, "--json", cwd=cwd, env=env,
                                       check=True).stdout)
        if state["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state
        if state["state"] == "PENDING" and state.get("reason") == "BeginTime" \
                and set(cluster.node_states().values()) == {"idle"}:
            time.sleep(1)
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"],
                           env=root_env(cluster), capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"job {job} still {state['state']} after {timeout}s")


def test_a_preempted_job_requeues_and_resumes_as_the_user(user, cluster):
    uid = str(user.pw.pw_uid)
    work = user.workdir("preempt")
    user.write(work / "who.py", WHO)
    user.write(work / "job.yaml", spec("preempt", work / "who.txt", epochs=200, extra=(
        "  checkpoint: {every_steps: 5}\n  preemption: {requeue: true}\n")))
    done = json.loads(user.hpcsuite("submit", "job.yaml", "--json", cwd=work).stdout)
    job, run = done["job_id"], Path(done["run_dir"])
    progress = run / "progress.json"
    deadline = time.monotonic() + 180
    while not (progress.is_file() and json.loads(progress.read_text() or "{}").get("step", 0) >= 5):
        assert time.monotonic() < deadline, "the job never reached step 5"
        time.sleep(0.2)
    # As Slurm's warning signal comes before a preemption (from root's slurmd).
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=root_env(cluster), check=True)
    assert follow(user, cluster, job, work)["state"] == "COMPLETED"
    results = json.loads((run / "results.json").read_text())
    assert [a["status"] for a in results["attempts"]] == ["preempted", "completed"]
    assert results["attempts"][1]["start_step"] == results["attempts"][0]["final_step"] > 0
    saved = run.parent / "checkpoints"          # the job name's, shared by its runs
    checkpoints = list(saved.rglob("*"))
    assert checkpoints and owners([saved, *checkpoints]) == {user.pw.pw_uid}
    assert owners(run.rglob("*")) == {user.pw.pw_uid}
    # Both attempts' ranks: the user's, the second a restart, never allowed to run as root.
    assert sorted(who(work / "who.txt")) == [[uid, uid, "0", "-"]] * 2 + [[uid, uid, "1", "-"]] * 2
    status = user.hpcsuite("status", job, cwd=work).stdout
    assert "2 attempts" in status, status


ONE_NODE = textwrap.dedent("""\
    name: {name}
    resources: {{nodes: 1, tasks_per_node: 1, time: "00:05:00"}}
    train:
      model: mlp
      data: {{kind: python, factory: {work}/who.py:make, args: {{n: 256, out: {work}/who.txt}}}}
      batch_size: 16
      epochs: 2
    """)


def test_a_sweep_and_a_study_point_run_as_the_user(user, cluster):
    uid = str(user.pw.pw_uid)
    work = user.workdir("sweep-study")
    user.write(work / "who.py", WHO)
    user.write(work / "job.yaml", ONE_NODE.format(name="base", work=work))
    user.write(work / "sweep.yaml", "name: lrs\nbase: job.yaml\naxes:\n  train.lr: [0.01, 0.1]\n"
                                    "max_parallel: 2\n")
    user.write(work / "study.yaml", "name: tiny\nbase: job.yaml\naxes: {nodes: [1]}\nrepeats: 1\n"
                                    "warmup_steps: 2\nsteps: 5\nlimit: false\n"
                                    "allreduce_bench: false\n")
    sweep = json.loads(user.hpcsuite("sweep", "run", "sweep.yaml", "--wait", "--json",
                                     cwd=work).stdout)
    assert [e["done"] for e in sweep["elements"]] == [True, True], sweep
    user.hpcsuite("study", "run", "study.yaml", "--wait", cwd=work)
    status = json.loads(user.hpcsuite("study", "status", "studies/tiny", "--json", cwd=work).stdout)
    assert [(s["point"], s["status"]) for s in status] == [("p00-r0", "done")], status
    # Three jobs (two elements, one point), one rank each, all the user's.
    assert who(work / "who.txt") == [[uid, uid, "0", "-"]] * 3
    made = [work / "sweeps", work / "studies", *(work / "sweeps").rglob("*"),
            *(work / "studies").rglob("*")]
    assert owners(made) == {user.pw.pw_uid}


SITE = textwrap.dedent("""\
    name: nonroot-site
    contact: admins@site.example
    partitions: {debug: {cpus_per_node: 2, max_time: "00:30:00"}, other: {cpus_per_node: 2}}
    defaults: {resources: {partition: debug}}
    setup: ["export SITE_SETUP=1"]
    locked: [resources.partition, site.setup]
    """)


def test_a_site_profile_the_user_cannot_write_holds_its_locks(user, cluster):
    """The site's directory stands in for /etc/hpcsuite (root's, mode 755, its profile 644):
    the real one would pin every other test running on this machine meanwhile."""
    site = Path(tempfile.mkdtemp(prefix="hpcsuite-nonroot-site-", dir="/tmp"))
    os.chmod(site, 0o755)
    (site / "profile.yaml").write_text(SITE)
    os.chmod(site / "profile.yaml", 0o644)
    work = user.workdir("locks")
    config = Path(user.pw.pw_dir) / ".config" / "hpcsuite"
    at_site = {"HPCSUITE_SITE_DIR": str(site), "HPCSUITE_PROFILE": None}
    try:
        user.write(work / "job.yaml", ONE_NODE.format(name="locked", work=work))
        user.write(work / "who.py", WHO)
        wrote = user.run("sh", "-c", f"echo 'locked: []' >> {site / 'profile.yaml'}", cwd=work)
        assert wrote.returncode != 0 and (site / "profile.yaml").read_text() == SITE
        fixed = f"the site fixes {{}} (in {site / 'profile.yaml'}); talk to admins@site.example"
        assert user.run("mkdir", "-p", str(config), cwd=work).returncode == 0
        (work / ".hpcsuite").mkdir()
        os.chown(work / ".hpcsuite", user.pw.pw_uid, user.pw.pw_gid)
        tries = [  # (file to write or None, its text, extra args, what the one line says)
            (config / "profile.yaml", "defaults: {resources: {partition: other}}\n", [],
             fixed.format("resources.partition")),
            (config / "profile.yaml", "partitions: {debug: {max_time: '7-00:00:00'}}\n", [],
             "partitions: only the site profile"),
            (work / ".hpcsuite" / "profile.yaml", "setup: ['echo mine']\n", [],
             fixed.format("site.setup")),
            (None, "", ["--set", "resources.partition=other"], fixed.format("resources.partition")),
        ]
        for path, text, args, said in tries:
            if path:
                user.write(path, text)
            proc = user.hpcsuite("submit", "job.yaml", *args, cwd=work, expect=2, **at_site)
            assert proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr
            if path:
                path.unlink()
        payload = json.loads(user.hpcsuite("submit", "job.yaml", "--wait", "--json", cwd=work,
                                           **at_site).stdout)
        assert payload["state"] == "COMPLETED"
        script = (Path(payload["run_dir"]) / "job.sbatch").read_text()
        assert "#SBATCH --partition=debug\n" in script and "export SITE_SETUP=1" in script
    finally:
        shutil.rmtree(site, ignore_errors=True)


def test_a_file_the_user_cannot_read_or_write_is_one_line(user, cluster):
    work = user.workdir("unreadable")
    user.write(work / "job.yaml", ONE_NODE.format(name="closed", work=work))
    user.write(work / "who.py", WHO)
    closed = Path(tempfile.mkdtemp(prefix="hpcsuite-nonroot-closed-", dir="/tmp"))
    os.chmod(closed, 0o755)                    # root's: the user may look, not write
    conf = closed / "slurm.conf"
    shutil.copy(cluster.conf, conf)
    os.chmod(conf, 0o600)
    secret = closed / "secret.yaml"
    secret.write_text("name: secret\n")
    os.chmod(secret, 0o600)
    user.write(work / "elsewhere.yaml", ONE_NODE.format(name="elsewhere", work=work)
               + f"output_dir: {closed}/runs\n")
    try:
        cases = [  # (argv, environment, what the one line starts with)
            (["lint", str(secret)], {}, f"error: {secret}: "),
            (["submit", "job.yaml"], {"HPCSUITE_PROFILE": str(secret)}, f"error: {secret}: "),
            (["submit", "elsewhere.yaml"], {}, f"error: {closed}/runs: Permission denied"),
            (["submit", "job.yaml"], {"SLURM_CONF": str(conf)},
             f"error: SLURM_CONF={conf}: this account cannot read it"),
            (["status", "1"], {"SLURM_CONF": str(conf)},
             f"error: SLURM_CONF={conf}: this account cannot read it"),
        ]
        for argv, env, said in cases:
            proc = user.hpcsuite(*argv, cwd=work, expect=2, **env)
            assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, \
                (argv, proc.stderr)
        assert not (closed / "runs").exists()
    finally:
        shutil.rmtree(closed, ignore_errors=True)


GROUP, COLLEAGUE = "hpcgroup", "hpcuser2"


@pytest.fixture(scope="module")
def group(user, cluster):
    """hpcuser and a colleague, hpcuser2, in one group, each with umask 002, and their
    project directory: setgid, the group's, 2775 (what a site gives a project)."""
    for argv in (["groupadd", GROUP], ["useradd", "--create-home", "--shell", "/bin/bash",
                                       "--user-group", COLLEAGUE]):
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode in (0, 9), done.stderr          # 9: it exists already
    for name in (USER, COLLEAGUE):
        subprocess.run(["usermod", "-aG", GROUP, name], check=True)
    home = Path(user.pw.pw_dir)          # the colleague runs hpcuser's venv (a site's shared one)
    os.chmod(home, home.stat().st_mode | 0o011)
    project = Path("/srv/hpcsuite-group-project")
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    shutil.chown(project, group=GROUP)
    os.chmod(project, 0o2775)
    yield (Account(user.pw, user.venv, cluster, umask=0o002),
           Account(pwd.getpwnam(COLLEAGUE), user.venv, cluster, umask=0o002), project)
    shutil.rmtree(project, ignore_errors=True)


def test_a_group_reads_and_continues_each_others_runs(group):
    """Issue 51, point 3: in a setgid project directory with umask 002 the colleague's submit
    is recorded, `status` of their own job by name and `status`/`report` of the first user's
    run read, and the group's run continues from the first user's checkpoints."""
    first, second, project = group
    job = ("name: shared\nresources: {nodes: 1, tasks_per_node: 1, time: '00:05:00'}\n"
           "train: {model: mlp, data: {samples: 256}, batch_size: 32, epochs: 1, "
           "checkpoint: {every_steps: 4}}\n")
    first.write(project / "shared.yaml", job)
    ran = json.loads(first.hpcsuite("submit", "shared.yaml", "--wait", "--json", cwd=project).stdout)
    assert ran["state"] == "COMPLETED", ran
    mine = second.hpcsuite("status", ran["job_id"], cwd=project).stdout      # a colleague's run
    assert "COMPLETED" in mine and "permission denied" not in mine, mine
    report = second.hpcsuite("report", ran["job_id"], cwd=project)
    assert "unreadable" not in report.stdout + report.stderr
    # The colleague trains the group's run on: its checkpoints and owner lock are the group's.
    cont = json.loads(second.hpcsuite("submit", "shared.yaml", "--set", "train.epochs=2",
                                      "--wait", "--json", cwd=project).stdout)
    assert cont["state"] == "COMPLETED", cont
    assert cont["results"]["attempts"][0]["start_step"] == ran["results"]["final_step"] > 0
    theirs = json.loads(second.hpcsuite("status", "shared", "--json", cwd=project).stdout)
    theirs = theirs[0] if isinstance(theirs, list) else theirs
    assert theirs["job_id"] == cont["job_id"], theirs            # by name: the latest, theirs
    shared = [project / ".hpcsuite" / "runs.jsonl", Path(ran["run_dir"]) / "results.json",
              Path(cont["run_dir"]) / "results.json", Path(cont["run_dir"]) / "attempts.jsonl",
              project / "runs" / "shared" / "checkpoints" / ".owner.lock"]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in shared} == \
        {p.name: "0o664" for p in shared}
    assert {p.group() for p in shared} == {GROUP}
