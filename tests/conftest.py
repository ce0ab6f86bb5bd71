"""Shared fixtures. The e2e tier brings up a private local Slurm cluster (its own directory
and ports, so a demo cluster may keep running) and always stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SBATCH = REPO / "sbatch"
TEST_PORT = int(os.environ.get("HPCSUITE_TEST_PORT", "16917"))
# Jobs several tests assert on, each run once per session (docs/contributing/test-tiers.md).
pytest_plugins = ["shared_observe", "shared_preempt"]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess:
    """`python -m hpcsuite ARGS` in a subprocess, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "hpcsuite", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpcsuite {' '.join(args)} exit {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def cli_as_nobody(*args: str, cluster_dir: Path) -> subprocess.CompletedProcess:
    """`hpcsuite ARGS` as the account nobody (no root), against the cluster in
    ``cluster_dir``."""
    probe = f"from hpcsuite.cli import main; main(args={list(args)!r}, prog_name='hpcsuite')"
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, env={"HPCSUITE_CLUSTER_DIR": str(cluster_dir),
                                           "PATH": "/usr/sbin:/usr/bin:/bin", "HOME": "/tmp"})


def wait_for_text(path: Path, text: str, timeout: float = 180) -> None:
    """Until ``text`` appears in the file at ``path`` (a job's log)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


def rank_pids(run_dir: str | Path) -> list[str]:
    """The pids of a job's ranks (not mpirun's or srun's, whose command lines name the same
    job file)."""
    pattern = f"^\\S*python\\S* -m hpcsuite train --job {run_dir}/job.json"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def follow_job(env: dict, job_id: str, cwd: Path, cluster=None, timeout: float = 400,
               on_hold=None) -> dict:
    """`status JOB --json` until the job has ended; that status. With ``cluster``, a requeued
    job held for Slurm's requeue delay (~2 min) is started as soon as the nodes are idle;
    ``on_hold(state)`` is called at each look while it is held, before that."""
    import json
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(run_cli("status", job_id, "--json", cwd=cwd, env=env, check=True).stdout)
        held = state["state"] == "PENDING" and state.get("reason") == "BeginTime"
        if held and on_hold is not None:
            on_hold(state)
        if cluster is not None and held and set(cluster.node_states().values()) == {"idle"}:
            time.sleep(1)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                           capture_output=True)
        if state["state"] in ENDED:
            return state
        time.sleep(1.5)   # each `status` is a Python start and Slurm's calls: CPU the job needs
    raise AssertionError(f"job {job_id} still {state['state']} after {timeout}s")


def preempt_after_step(env: dict, job_id: str, run_dir: Path, step: int = 5,
                       timeout: float = 120) -> None:
    """Once the job's progress.json shows ``step`` (rank 0 writes it every ~2 s), send the
    preemption signal to its batch shell, as Slurm's warning signal would come."""
    import json
    import time

    from hpcsuite.runs.rundir import RunDir

    progress = RunDir(run_dir).progress
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if progress.is_file() and json.loads(progress.read_text()).get("step", 0) >= step:
            break
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)


def submit_spec(env: dict, work: Path, spec_text: str, *args: str, name: str = "job.yaml",
                expect: int = 0) -> dict:
    """Write a spec into ``work``, `submit --wait --json` it, check the exit code; the JSON."""
    import json

    spec = work / name
    spec.write_text(spec_text)
    proc = run_cli("submit", str(spec), "--wait", "--json", *args, cwd=work, env=env, timeout=800)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A directory to work in, with no site, user or project profile of this machine."""
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory):
    """A running two-node Slurm cluster; yields (LocalCluster, env for Slurm clients)."""
    from hpcsuite.site.cluster import LocalCluster

    root = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster(root, port=TEST_PORT)
    try:
        cluster.up(timeout=90)
        env = dict(os.environ, SLURM_CONF=str(cluster.conf), HPCSUITE_CLUSTER_DIR=str(root))
        yield cluster, env
    finally:
        cluster.down()
        assert not any(cluster.states().values()), "a cluster daemon survived `down`"


@pytest.fixture(scope="session")
def wide_cluster():
    """One running cluster of 2 nodes x 2 cores (declared as 2 GPUs a node), with accounting, in a
    directory every account can reach, started the first time a test asks for it: for the tests
    that need two ranks a node, GPUs, the test account or another MPI (test_e2e_gpu, _mpis,
    _nonroot, _install). Each module's own fixture cancels what its tests left queued
    (:func:`cancel_all`). The fabric cluster stays its own (namespaces; its last test takes
    it down)."""
    import shutil
    import tempfile

    from hpcsuite.site.cluster import LocalCluster

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks a node need 2 cores here")
    if os.geteuid() != 0:
        pytest.skip("the local cluster runs as root")
    root = Path(tempfile.mkdtemp(prefix="hpcsuite-wide-cluster-", dir="/tmp"))
    os.chmod(root, 0o755)
    cluster = LocalCluster(root, port=TEST_PORT + 40, gpus=2)
    try:
        cluster.up(timeout=120)
        yield cluster
    finally:
        cluster.down()
        assert not any(cluster.states().values()), "a cluster daemon survived `down`"
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def account():
    """The unprivileged account `hpcuser` and its own venv of this checkout
    (scripts/test_account.sh --venv): (its passwd entry, the venv). Its jobs run as a site's
    users' do (test_e2e_nonroot); it is the user on the login node of test_e2e_remote."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("makes the account hpcuser: run as root")
    done = subprocess.run(["bash", str(REPO / "scripts" / "test_account.sh"), "--venv"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    return pwd.getpwnam("hpcuser"), Path(done.stdout.strip().splitlines()[-1])


BROKEN = ("name: broken\nresources: {nodes: 1, time: '00:02:00'}\n"
          "train: {model: nosuchmodel, max_steps: 1}\n")


@pytest.fixture(scope="session")
def broken_job(local_cluster, tmp_path_factory):
    """A job that fails on its input in the job (a model name the runtime does not know), run
    with `submit --wait` from a directory of its own: (env, that directory, the
    CompletedProcess). Read by test_e2e::test_failing_job_exits_nonzero_with_log_tail and
    test_e2e_truth::test_cancel_says_what_it_did_and_status_and_logs_say_what_is."""
    _, env = local_cluster
    work = tmp_path_factory.mktemp("broken")
    (work / "broken.yaml").write_text(BROKEN)
    return env, work, run_cli("submit", "broken.yaml", "--wait", "--timeout", "300", cwd=work,
                              env=env, timeout=400)


def cancel_all(cluster) -> None:
    """Cancel every job on ``cluster`` (a module's teardown on the shared wide cluster: what a
    failed test left queued must not hold the next module's jobs)."""
    env = dict(os.environ, **cluster.client_env())
    ids = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True,
                         timeout=30).stdout.split()
    if ids:
        subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=30)


SLURM_22_05 = Path(__file__).parent / "data" / "slurm" / "22.05.8"


def slurm_says_its_release(argv):
    """For a fake slurm.call: what the local cluster's Slurm 22.05 answers to `sbatch --version`
    and `scontrol show config` (recorded; submit applies that release's rules), else None."""
    from hpcsuite import slurm

    if argv[:2] == ["sbatch", "--version"] or argv[:3] == ["scontrol", "show", "config"]:
        name = "sbatch-version.txt" if argv[0] == "sbatch" else "scontrol-show-config.txt"
        return slurm.Completed(argv, 0, (SLURM_22_05 / name).read_text(), "")
    return None


TEST_ACCOUNT = "hpcuser"    # made by scripts/test_account.sh (setup.sh runs it as root)


def as_account(fn):
    """``fn()`` in a forked child that runs as the unprivileged test account, for a test of a
    file the user cannot read (root reads any file); what it returns (JSON-able). Not root:
    ``fn()`` here. The child has what this process imported, and needs no Python of its own."""
    import json
    import pwd

    if os.geteuid() != 0:
        return fn()
    try:
        pw = pwd.getpwnam(TEST_ACCOUNT)
    except KeyError:
        pytest.skip(f"no account {TEST_ACCOUNT}: scripts/test_account.sh makes it (as root)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never back into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            out = json.dumps({"result": fn()})
        except BaseException as e:  # noqa: BLE001 - reported by the parent
            out = json.dumps({"error": repr(e)})
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    answer = json.loads(data)
    assert "error" not in answer, f"as {TEST_ACCOUNT}: {answer.get('error')}"
    return answer["result"]


# ------------------------------------------------------------------ tiers (tests/tiers.py)
def pytest_configure(config):
    for name, what in (("fast", "in make test-fast: one end-to-end job per main user path"),
                       ("full", "only in make test-full: a repeat along one axis "
                                "(tests/tiers.py says which test keeps it in CI)")):
        config.addinivalue_line("markers", f"{name}: {what}")


@pytest.hookimpl(tryfirst=True)      # before -m selects on the markers
def pytest_collection_modifyitems(config, items):
    from tiers import stale, tier_of

    for item in items:
        for mark in tier_of(item.nodeid):
            item.add_marker(getattr(pytest.mark, mark))
    if not all(Path(a).is_dir() for a in config.args):
        return                  # a file or a test asked for by name: its entries may be absent
    unknown = stale([item.nodeid for item in items])
    if unknown:
        raise pytest.UsageError(f"tests/tiers.py names {len(unknown)} test(s) no file has: "
                                + "; ".join(unknown))
