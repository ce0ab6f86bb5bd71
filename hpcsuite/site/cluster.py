"""A real Slurm cluster of 2 to 64 nodes on this one machine, owned by hpcsuite, for demos,
tests and scale benchmarks.

munged, MariaDB and slurmdbd (accounting, so ``sacct`` answers as on a real cluster),
slurmctld and one ``slurmd -N nodeX`` a node (Debian's slurmd supports several per host) run with
config, keys, database, state, spool and logs all under one directory (``cluster_dir()``),
never touching /etc/slurm, /etc/munge or the system's MariaDB. Slurm's commands reach it
through ``SLURM_CONF``, and jobs render with the cluster's own site profile
(``etc/hpcsuite/profile.yaml``); ``hpcsuite cluster env`` prints both for a shell. What the
config files say is ``slurm_conf``'s. Nothing outside these two modules and ``hpcsuite
cluster`` knows the cluster exists: a production login node never runs this code.

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
from pathlib import Path

from .. import slurm
from ..errors import UserError
from .daemons import (Daemon, affinity, alive, closed_to_others, end_jobs, failure_line,
                      is_ours, listening, port_taken, which)
from .fabric import LocalFabric
from .horovod_mpi import flavour_on_path
from .slurm_conf import (DB_NAME, DB_OFFSET, DB_USER, DBD_OFFSET, TASK_PROLOG, gpu_devices,
                         declared, make_device, node_names, node_port, render_conf,
                         render_dbd_conf, render_gres_conf, render_profile)

log = logging.getLogger(__name__)

DEFAULT_PORT = 16817   # slurmctld's; slurm_conf lays out the others from it


def node_cpus(index: int) -> tuple[int, ...]:
    """The core of virtual node ``index``: the i-th core this process may use (wrapping).

    Each node is declared with CPUs=1, and its slurmd starts pinned to its own core, so the
    tasks it starts (batch script, mpirun, orted, ranks) inherit it, as on separate machines.
    Unpinned, the two nodes' ranks and Horovod threads drifted onto one core in some jobs and
    not others: 2-node steps swung between 2.1 and 3.3 ms from job to job (docs/BENCHMARKS.md).
    """
    cores = sorted(os.sched_getaffinity(0))
    return (cores[index % len(cores)],)


# Where the cluster lives unless HPCSUITE_CLUSTER_DIR says: a system place every account can
# reach, since it serves them all (root starts it; each user's Slurm commands read its
# slurm.conf and talk to its munge socket). It was ~/.local/state under root's home (mode 700).
DEFAULT_DIR = Path("/var/lib/hpcsuite/cluster")


def cluster_dir() -> Path:
    env = os.environ.get("HPCSUITE_CLUSTER_DIR")
    return Path(env).absolute() if env else DEFAULT_DIR


class LocalCluster:
    def __init__(self, root: Path, port: int = DEFAULT_PORT, accounting: bool | None = None,
                 gpus: int = 0, fabric: str | None = None, nodes: int | None = None):
        self.root = Path(root)
        self.port = port
        self.gpus = gpus         # GPUs per node declared to Slurm (gres), backed by device files
        self.conf = self.root / "etc" / "slurm.conf"
        # --nodes N; without it, as many as the cluster's slurm.conf names (2 for a new one).
        # A running cluster keeps its nodes: `up` says how to change them.
        self.asked_nodes = nodes
        recorded = self.recorded_nodes()
        if nodes is None or (recorded not in (None, nodes) and self._ctld_pid() is not None):
            nodes = recorded or 2
        self.nodes = node_names(nodes)
        # --fabric RATE: each node in a network namespace on a link shaped to RATE (fabric.py);
        # without it, the fabric the running cluster was started with (None: loopback)
        self.asked_fabric = LocalFabric(port, fabric, self.nodes) if fabric else None
        self.fabric = self.asked_fabric or LocalFabric.recorded(self.root)
        self.profile = self.root / "etc" / "hpcsuite" / "profile.yaml"
        # Beside the pid files, not in munge/ (the key's, mode 700): every account's Slurm
        # commands connect to it.
        self.munge_socket = self.root / "run" / "munge.socket.2"
        self.db_socket = self.root / "db" / "mariadb.sock"
        self.hostname = socket.gethostname()
        # Accounting (slurmdbd + MariaDB) when both are installed, unless told.
        self.accounting = (which("slurmdbd") and which("mariadbd")) if accounting is None \
            else accounting

    def client_env(self) -> dict[str, str]:
        """What a shell (or a test) sets to use this cluster: its slurm.conf and site profile."""
        return {"SLURM_CONF": str(self.conf), "HPCSUITE_PROFILE": str(self.profile)}

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
        ds = [Daemon("munged", tuple(munge), "munged")]
        if self.accounting:
            ports = self.ports()
            ds.append(Daemon("mariadbd", (
                "mariadbd", "--no-defaults", f"--datadir={self._path('db', 'data')}",
                "--user=root", f"--socket={self.db_socket}", f"--port={ports['mariadbd']}",
                "--bind-address=127.0.0.1", "--skip-name-resolve",
                f"--pid-file={self._path('run', 'mariadbd.pid')}",
                f"--log-error={self._path('log', 'mariadbd.log')}",
                "--innodb-buffer-pool-size=32M", "--performance-schema=OFF"), "mariadbd"))
            # slurmdbd reads slurmdbd.conf beside SLURM_CONF (it has no option for a path).
            ds.append(Daemon("slurmdbd", ("slurmdbd", "-D"), "slurmdbd"))
        ds.append(Daemon("slurmctld", ("slurmctld", "-D", "-f", str(self.conf)), "slurmctld"))
        for i, n in enumerate(self.nodes):
            argv = ("slurmd", "-D", "-N", n, "-f", str(self.conf))
            ds.append(Daemon(f"slurmd-{n}", self.fabric.wrap(n, argv) if self.fabric else argv,
                             "slurmd", node_cpus(i)))
        return ds

    def ports(self) -> dict[str, int]:
        ports = {"slurmctld": self.port}
        ports.update({f"slurmd-{n}": node_port(self.port, i) for i, n in enumerate(self.nodes)})
        if self.accounting:
            ports.update(mariadbd=self.port + DB_OFFSET, slurmdbd=self.port + DBD_OFFSET)
        return ports

    def addresses(self) -> tuple[str, dict[str, str]]:
        """(slurmctld's address, each node's): loopback, or the fabric's subnet."""
        f = self.fabric
        if f is None:
            return "127.0.0.1", {n: "127.0.0.1" for n in self.nodes}
        return f.controller_addr, {n: f.addr(n) for n in self.nodes}

    def _db_password(self) -> str:
        path = self._path("db", "password")
        if not path.exists():
            path.write_text(secrets.token_hex(16))
            os.chmod(path, 0o600)
        return path.read_text().strip()

    def _prepare(self) -> None:
        for d in ("etc/hpcsuite", "munge", "run", "log", "state", "db",
                  *[f"spool/{n}" for n in self.nodes], *[f"tmp/{n}" for n in self.nodes]):
            self._path(d).mkdir(parents=True, exist_ok=True)
        # What every account reads (config, profile, the munge socket's directory) is open to
        # all, whatever root's umask; the munge key and the database are root's.
        for d in ("", "etc", "etc/hpcsuite", "run", "log"):
            os.chmod(self._path(d), 0o755)
        os.chmod(self._path("munge"), 0o700)
        os.chmod(self._path("db"), 0o700)
        key = self._path("munge", "munge.key")
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(render_conf(self.root, self.port, self.hostname, self.munge_socket,
                                         self.accounting, self.gpus, self.addresses()))
        gres = self._path("etc", "gres.conf")      # slurmd reads it beside slurm.conf
        if self.gpus:
            for n in self.nodes:
                for device in gpu_devices(self.root, n, self.gpus):
                    make_device(device)
            gres.write_text(render_gres_conf(self.root, self.gpus, self.nodes))
        else:
            gres.unlink(missing_ok=True)
        prolog = self._path("etc", "task_prolog.sh")
        prolog.write_text(TASK_PROLOG)
        os.chmod(prolog, 0o755)
        self.profile.write_text(render_profile(self.gpus, flavour_on_path(dict(os.environ)),
                                               self.fabric.rate if self.fabric else None,
                                               len(self.nodes)))
        for path in (self.conf, gres, self.profile):
            if path.exists():
                os.chmod(path, 0o644)
        if self.accounting:
            dbd = self._path("etc", "slurmdbd.conf")
            dbd.write_text(render_dbd_conf(self.root, self.port, self.hostname, self.munge_socket,
                                           self._db_password(), self.addresses()[0]))
            os.chmod(dbd, 0o600)       # slurmdbd refuses a config others can read
            if not self._path("db", "data", "mysql").is_dir():
                slurm.call(["mariadb-install-db", "--no-defaults",
                            f"--datadir={self._path('db', 'data')}", "--user=root",
                            "--skip-test-db", "--auth-root-authentication-method=socket"],
                           env=self.env(), timeout=120)

    def _grant(self) -> None:
        """The database user slurmdbd logs in as (idempotent)."""
        pw = self._db_password()
        sql = (f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
               f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
               f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")
        deadline = time.monotonic() + 30
        while True:
            done = slurm.call(["mariadb", "--no-defaults", f"--socket={self.db_socket}", "-uroot",
                               "-e", sql], env=self.env(), timeout=30, check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise UserError(f"MariaDB of the local cluster refused its setup: "
                                f"{(done.stderr or done.stdout).strip()} "
                                f"(logs in {self._path('log')})")
            time.sleep(0.5)

    # ------------------------------------------------------------------ pids
    def _pidfile(self, d: Daemon) -> Path:
        return self._path("run", f"{d.name}.hpcsuite.pid")

    def _pid(self, d: Daemon) -> int | None:
        try:
            pid = int(self._pidfile(d).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if is_ours(pid, d.program, str(self.root)) else None

    def _ctld_pid(self) -> int | None:
        return self._pid(Daemon("slurmctld", (), "slurmctld"))

    def recorded_nodes(self) -> int | None:
        """How many nodes the cluster's slurm.conf names (None before its first start)."""
        return declared(self.conf)[0]

    def states(self) -> dict[str, int | None]:
        return {d.name: self._pid(d) for d in self.daemons()}

    def running(self) -> bool:
        return all(pid is not None for pid in self.states().values())

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 60.0) -> list[str]:
        """Start what is not running and wait until every node is idle. Returns notes."""
        if self.asked_fabric is not None and os.geteuid() != 0:
            self.asked_fabric.create()      # says, in one line, that it needs root
        if os.geteuid() != 0:
            raise UserError("the local Slurm cluster runs its daemons as root (SlurmUser=root); "
                            "run `hpcsuite cluster up` as root")
        for prog in ("munged", "slurmctld", "slurmd", "sinfo"):
            if not which(prog):
                raise UserError(f"{prog} not found on PATH: install Debian's slurm-wlm and munge "
                                "(scripts/setup.sh does)")
        cores = len(os.sched_getaffinity(0))
        if self.gpus > cores:
            raise UserError(f"--gpus {self.gpus}: a node has one core per GPU, and this machine "
                            f"gives hpcsuite {cores}")
        notes = []
        states = self.states()
        if all(states.values()):
            notes += self._running_notes(states)
        else:
            for d in self.daemons():
                port = self.ports().get(d.name)
                if not states[d.name] and port is not None and port_taken(port):
                    raise UserError(f"port {port} for {d.name} is already in use; "
                                    f"stop whatever listens there or use --port")
            self._network(started=not any(states.values()))
            self._prepare()
            closed = closed_to_others(self.root)
            if closed:
                notes.append(f"{closed} is closed to other accounts (mode "
                             f"{closed.stat().st_mode & 0o777:o}): only root can use this cluster;"
                             f" HPCSUITE_CLUSTER_DIR elsewhere (default {DEFAULT_DIR}) serves all")
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
                if self.fabric is not None and not any(states.values()):
                    self.fabric.remove()
                    LocalFabric.record_path(self.root).unlink(missing_ok=True)
                raise
            return notes
        self._wait_idle(timeout)
        return notes

    def _running_notes(self, states: dict[str, int | None]) -> list[str]:
        """What `up` says of a cluster that already runs, and how it differs from the ask."""
        notes = [f"cluster already up ({self.root})"]
        if self.asked_nodes not in (None, len(self.nodes)):
            notes.append(f"it runs with {len(self.nodes)} nodes, not {self.asked_nodes}: "
                         "`hpcsuite cluster down` and up again to change it")
        if self.declared_gpus() != self.gpus:
            notes.append(f"it runs with {self.declared_gpus()} GPUs per node, not "
                         f"{self.gpus}: `hpcsuite cluster down` and up again to change it")
        for d in self.daemons():
            if d.cpus and affinity(states[d.name]) not in (None, set(d.cpus)):
                notes.append(f"{d.name} was started on cores {sorted(affinity(states[d.name]))}"
                             f", not its own core {list(d.cpus)}: `hpcsuite cluster down` "
                             "and up again to pin it")
        if self.asked_fabric and self.asked_fabric != self.fabric_running():
            notes.append(f"it runs {self.fabric_words()}: `hpcsuite cluster fabric "
                         f"{self.asked_fabric.rate}` changes a fabric's rate; `cluster "
                         "down` and up again to change the rest")
        return notes

    def _network(self, started: bool) -> None:
        """The nodes' network namespaces and shaped links (--fabric), made before any daemon
        starts; none, and no record, for a cluster on loopback."""
        if not started:          # some daemons still run: they keep the network they have
            return
        record = LocalFabric.record_path(self.root)
        old = LocalFabric.recorded(self.root)
        if old is not None and old != self.asked_fabric:
            old.remove()
        self.fabric = self.asked_fabric
        if self.fabric is None:
            record.unlink(missing_ok=True)
            return
        self.fabric.create()
        record.parent.mkdir(parents=True, exist_ok=True)
        self.fabric.record(self.root)

    def fabric_running(self) -> "LocalFabric | None":
        f = LocalFabric.recorded(self.root)
        return f if f is not None and f.exists() else None

    def fabric_words(self) -> str:
        f = self.fabric_running()
        return "on loopback (no --fabric)" if f is None else \
            f"with --fabric {f.rate} (nodes {', '.join(f'{n}={f.addr(n)}' for n in f.nodes)})"

    def declared_gpus(self) -> int:
        """GPUs per node the running configuration declares (0 when none or no config)."""
        return declared(self.conf)[1]

    def _start(self, d: Daemon) -> None:
        log_path = self._path("log", f"{d.name}.out")
        pid = slurm.spawn_daemon(list(d.argv), env=self.env(), log_path=str(log_path),
                                 cpus=d.cpus)
        self._pidfile(d).write_text(f"{pid}\n")
        port = self.ports().get(d.name)
        if d.name == "munged":
            ready = lambda: self.munge_socket.exists()  # noqa: E731
        elif d.name == "mariadbd":
            ready = lambda: self.db_socket.exists()  # noqa: E731
        elif d.name == "slurmdbd":
            ready = lambda: listening(port)  # noqa: E731
        else:
            ready = lambda: True  # noqa: E731  (readiness is checked through sinfo)
        wait = 30 if d.name in ("mariadbd", "slurmdbd") else 10
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid):
                raise UserError(f"{d.name} exited at start: {self._why(d)}")
            if ready():
                time.sleep(0.3)
                if alive(pid):
                    if d.name == "mariadbd":
                        self._grant()
                    return
            time.sleep(0.1)
        if not ready():
            raise UserError(f"{d.name} did not become ready within {wait}s: {self._why(d)}")

    def _why(self, d: Daemon) -> str:
        """The most telling log line of a daemon that failed."""
        return failure_line(self._path("log"), d.name)

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
            if nodes and all(nodes.get(n) in ("idle", "mixed", "allocated") for n in self.nodes):
                return
            for n, state in nodes.items():
                if state in ("down", "drained", "draining", "drain"):
                    slurm.call(["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                               env=self.env(), timeout=15, check=False)
            time.sleep(0.5)
        raise UserError(f"nodes not idle after {timeout:g}s: {nodes or 'sinfo gave no answer'}; "
                        f"see {self._path('log')}")

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop every daemon this cluster started, slurmd first, munged last; then remove the
        nodes' namespaces and links (--fabric). Jobs still in Slurm are cancelled first."""
        ended = end_jobs(self.env()) if self.states().get("slurmctld") else 0
        notes = [f"cancelled {ended} job(s) still in Slurm"] if ended else []
        notes += self._stop(reversed(self.daemons()), timeout)
        fabric = LocalFabric.recorded(self.root)
        if fabric is not None and fabric.exists():
            fabric.remove()
            notes.append(f"removed the nodes' network namespaces and the {fabric.rate} links")
        return notes or ["nothing was running"]

    def _stop(self, daemons, timeout: float = 20.0) -> list[str]:
        notes = []
        for d in daemons:
            pid = self._pid(d)
            if pid is None:
                self._pidfile(d).unlink(missing_ok=True)
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
                notes.append(f"killed {d.name} (pid {pid}) after {timeout:g}s")
            else:
                notes.append(f"stopped {d.name} (pid {pid})")
            self._pidfile(d).unlink(missing_ok=True)
        return notes

    def resume_unresponsive(self, node: str, wait: float = 15.0) -> bool:
        """``node`` back in service if Slurm set it DOWN for not responding (its link was
        down): slurmctld does not ping a DOWN node again, so it would stay down. Whether it
        was resumed."""
        done = slurm.call(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], env=self.env(),
                          timeout=15, check=False)
        if not done.stdout.strip().startswith("down"):
            return False
        slurm.call(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=self.env(),
                   timeout=15, check=False)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.node_states().get(node, "").startswith("down"):
            time.sleep(0.5)
        return True

    def node_states(self) -> dict[str, str]:
        if not self.running():
            return {}
        done = slurm.call(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), timeout=15,
                          check=False)
        return slurm.parse_sinfo_nodes(done.stdout)
