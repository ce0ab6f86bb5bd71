"""A real two-node Slurm cluster on this one machine, owned by hpcsuite.

munged, slurmctld and two ``slurmd -N nodeX`` (Debian's slurmd supports several per host)
run with config, keys, state, spool and logs all under one directory (``cluster_dir()``),
never touching /etc/slurm or /etc/munge. Slurm's commands reach it through ``SLURM_CONF``.

Each daemon runs in the foreground (``-D``/``-F``) as a child we detach, so its pid is ours
to record and to stop; ``down`` signals exactly those pids after checking they still run
the program we started.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from . import slurm
from .errors import UserError

log = logging.getLogger(__name__)

DEFAULT_PORT = 16817        # slurmctld; slurmd of node i listens on DEFAULT_PORT + i
NODES = ("node1", "node2")
PARTITION = "debug"
# A second partition on the same nodes: what a site's partition lock keeps jobs out of (tests).
OTHER_PARTITION = "other"


def cluster_dir() -> Path:
    env = os.environ.get("HPCSUITE_CLUSTER_DIR")
    if env:
        return Path(env).absolute()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpcsuite" / "cluster"


def active_slurm_conf() -> str | None:
    """SLURM_CONF when set; else the local cluster's config while that cluster runs."""
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    cluster = LocalCluster(cluster_dir())
    if cluster.conf.exists() and cluster.running():
        return str(cluster.conf)
    return None


@dataclass(frozen=True)
class Daemon:
    name: str          # munged, slurmctld, slurmd-node1, ...
    argv: tuple[str, ...]
    program: str       # what /proc/<pid>/comm must show


class LocalCluster:
    def __init__(self, root: Path, port: int = DEFAULT_PORT):
        self.root = Path(root)
        self.port = port
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self.hostname = socket.gethostname()

    # ------------------------------------------------------------------ layout
    def _path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def daemons(self) -> list[Daemon]:
        munge = [
            "munged", "-F", "--force", f"--socket={self.munge_socket}",
            f"--key-file={self._path('munge', 'munge.key')}",
            f"--pid-file={self._path('run', 'munged.pid')}",
            f"--seed-file={self._path('munge', 'munged.seed')}",
            f"--log-file={self._path('log', 'munged.log')}",
        ]
        ds = [Daemon("munged", tuple(munge), "munged"),
              Daemon("slurmctld", ("slurmctld", "-D", "-f", str(self.conf)), "slurmctld")]
        ds += [Daemon(f"slurmd-{n}", ("slurmd", "-D", "-N", n, "-f", str(self.conf)), "slurmd")
               for n in NODES]
        return ds

    def ports(self) -> dict[str, int]:
        ports = {"slurmctld": self.port}
        ports.update({f"slurmd-{n}": self.port + i + 1 for i, n in enumerate(NODES)})
        return ports

    def render_conf(self) -> str:
        r = self.root
        host = self.hostname
        lines = [
            "# Written by `hpcsuite cluster up`; regenerated on every start.",
            "ClusterName=hpcsuite",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            # Per-node TmpFS: PMIx puts its per-step app dir there, and two virtual nodes
            # sharing /tmp collide on it (see docs/CLUSTER.md).
            f"TmpFS={r}/tmp/%n",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/log/jobcomp.txt",
            "MinJobAge=3600",
            "KillWait=10",
            "InactiveLimit=0",
            "SlurmdTimeout=60",
            "MessageTimeout=20",
            "PlugStackConfig=/dev/null",
        ]
        for i, n in enumerate(NODES):
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 "
                         f"Port={self.port + i + 1} CPUs=1 State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        lines.append(f"PartitionName={OTHER_PARTITION} Nodes={','.join(NODES)} Default=NO "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _prepare(self) -> None:
        for d in ("etc", "munge", "run", "log", "state", *[f"spool/{n}" for n in NODES],
                  *[f"tmp/{n}" for n in NODES]):
            self._path(d).mkdir(parents=True, exist_ok=True)
        os.chmod(self._path("munge"), 0o700)
        key = self._path("munge", "munge.key")
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(self.render_conf())

    # ------------------------------------------------------------------ pids
    def _pidfile(self, d: Daemon) -> Path:
        return self._path("run", f"{d.name}.hpcsuite.pid")

    def _pid(self, d: Daemon) -> int | None:
        try:
            pid = int(self._pidfile(d).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _is_ours(pid, d.program, str(self.root)) else None

    def states(self) -> dict[str, int | None]:
        return {d.name: self._pid(d) for d in self.daemons()}

    def running(self) -> bool:
        return all(pid is not None for pid in self.states().values())

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 60.0) -> list[str]:
        """Start what is not running and wait until every node is idle. Returns notes."""
        if os.geteuid() != 0:
            raise UserError("the local Slurm cluster runs its daemons as root (SlurmUser=root); "
                            "run `hpcsuite cluster up` as root")
        for prog in ("munged", "slurmctld", "slurmd", "sinfo"):
            if not _which(prog):
                raise UserError(f"{prog} not found on PATH: install Debian's slurm-wlm and munge "
                                "(scripts/setup.sh does)")
        notes = []
        states = self.states()
        if all(states.values()):
            notes.append(f"cluster already up ({self.root})")
        else:
            for d in self.daemons():
                port = self.ports().get(d.name)
                if not states[d.name] and port is not None and _port_taken(port):
                    raise UserError(f"port {port} for {d.name} is already in use; "
                                    f"stop whatever listens there or use --port")
            self._prepare()
            started = []
            try:
                for d in self.daemons():
                    if not states[d.name]:
                        self._start(d)
                        started.append(d)
                        notes.append(f"started {d.name} (pid {self._pid(d)})")
                self._wait_idle(timeout)
            except BaseException:
                self._stop(reversed(started))   # leave nothing half-up behind
                raise
            return notes
        self._wait_idle(timeout)
        return notes

    def _start(self, d: Daemon) -> None:
        log_path = self._path("log", f"{d.name}.out")
        pid = slurm.spawn_daemon(list(d.argv), env=self.env(), log_path=str(log_path))
        self._pidfile(d).write_text(f"{pid}\n")
        if d.name == "munged":
            ready = lambda: self.munge_socket.exists()  # noqa: E731
        else:
            ready = lambda: True  # noqa: E731  (readiness is checked through sinfo)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _alive(pid):
                raise UserError(f"{d.name} exited at start: {self._why(d)}")
            if ready():
                time.sleep(0.3)
                if _alive(pid):
                    return
            time.sleep(0.1)
        if not ready():
            raise UserError(f"{d.name} did not become ready within 10s: {self._why(d)}")

    def _why(self, d: Daemon) -> str:
        """The most telling log line of a daemon that failed."""
        candidates = [self._path("log", f"{d.name}.out")]
        if d.name == "munged":
            candidates.append(self._path("log", "munged.log"))
        elif d.name == "slurmctld":
            candidates.append(self._path("log", "slurmctld.log"))
        else:
            candidates.append(self._path("log", f"{d.name}.log"))
        lines: list[str] = []
        for path in candidates:
            try:
                lines += path.read_text(errors="replace").splitlines()[-50:]
            except OSError:
                pass
        bad = [l for l in lines if any(w in l.lower() for w in ("fatal", "error"))]
        pick = (bad or lines or ["no log output"])[-1].strip()
        return f"{pick} (logs in {self._path('log')})"

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        nodes: dict[str, str] = {}
        while time.monotonic() < deadline:
            for d in self.daemons():
                if self._pid(d) is None:
                    raise UserError(f"{d.name} stopped while the cluster came up: {self._why(d)}")
            done = slurm.call(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(),
                              timeout=15, check=False)
            nodes = slurm.parse_sinfo_nodes(done.stdout)
            if nodes and all(nodes.get(n) in ("idle", "mixed", "allocated") for n in NODES):
                return
            for n, state in nodes.items():
                if state in ("down", "drained", "draining", "drain"):
                    slurm.call(["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                               env=self.env(), timeout=15, check=False)
            time.sleep(0.5)
        raise UserError(f"nodes not idle after {timeout:g}s: {nodes or 'sinfo gave no answer'}; "
                        f"see {self._path('log')}")

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop every daemon this cluster started, slurmd first, munged last."""
        return self._stop(reversed(self.daemons()), timeout) or ["nothing was running"]

    def _stop(self, daemons, timeout: float = 20.0) -> list[str]:
        notes = []
        for d in daemons:
            pid = self._pid(d)
            if pid is None:
                self._pidfile(d).unlink(missing_ok=True)
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                notes.append(f"killed {d.name} (pid {pid}) after {timeout:g}s")
            else:
                notes.append(f"stopped {d.name} (pid {pid})")
            self._pidfile(d).unlink(missing_ok=True)
        return notes

    def node_states(self) -> dict[str, str]:
        if not self.running():
            return {}
        done = slurm.call(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), timeout=15,
                          check=False)
        return slurm.parse_sinfo_nodes(done.stdout)


# ---------------------------------------------------------------------- helpers

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_ours(pid: int, program: str, root: str) -> bool:
    """The pid still runs ``program`` with our cluster directory on its command line."""
    if not _alive(pid):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return comm == program and root in cmdline


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _which(prog: str) -> bool:
    from shutil import which
    return which(prog) is not None
