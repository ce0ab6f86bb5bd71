"""The local cluster's network (``hpcsuite cluster up --fabric RATE``): each node a network
namespace of its own, joined to the controller's (this machine's) by a shaped link.

A bridge in the controller's namespace holds the first address of the cluster's subnet; each
node's namespace has a veth pair whose far end is the node's ``eth0`` with its own address.
Both ends of each pair carry a ``tbf`` qdisc at RATE, so a node's traffic is shaped in both
directions, and traffic between node1 and node2 crosses two shaped hops (node1's egress, then
the bridge's egress towards node2): the path runs at RATE. Each node's slurmd (and so every
process a job starts there: the batch script, mpirun's daemons, the ranks) runs in its
namespace under ``nsenter --net``; slurmctld, slurmdbd, MariaDB and munge stay in the
controller's. The munge socket and the cluster's files are reached through the filesystem,
which the namespaces share.

This kernel has ``tbf`` and ``htb`` but not ``netem``: a link's rate is shaped, its latency is
not (ENVIRONMENT.md). What the fabric is is kept in the cluster's ``etc/fabric.json``, so
`cluster fabric`, `cluster link` and `cluster status` act on the running one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError

NODE_IF = "eth0"              # the node's end of its link, inside its namespace
# tbf's queue: what waits longer is dropped. A switch's buffer, not a home router's: with 50 ms
# TCP filled the queue, each round trip took tens of ms, and every step's allreduce, after the
# link idled through the computation, paid TCP's slow start again over those round trips (an
# 8 MB allreduce at 1 Gbit/s: 135 ms steps, 119 with tcp_slow_start_after_idle=0, 121 with this
# queue). Raw TCP reaches the rate either way (0.956 of 250 Mbit/s, 0.953 of 1 Gbit/s).
LIMIT_LATENCY_MS = 5
# tbf's bucket: one 64 KiB GSO segment, what a veth sends at once (tbf drops what exceeds the
# burst). No more: the bucket refills while the link idles (a rank computing), and a burst goes
# at memory speed, which no wire does. A 10 ms bucket made a 1 MB allreduce after 11 ms of
# compute 14 % faster than the rate allows; raw TCP reaches the rate either way (0.956 of
# 250 Mbit/s and 0.952 of 1 Gbit/s with 64 KiB, 0.959 with 10 ms).
BURST = 64 * 1024
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_UNIT = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
MIN_BPS, MAX_BPS = 1e6, 40e9  # what tbf shapes usefully on this machine's cores


def rate_bps(rate: str, where: str = "--fabric") -> float:
    """``250mbit`` -> 2.5e8 bits/s; anything else one line naming ``where``."""
    m = _RATE.match(str(rate).strip().lower())
    if not m:
        raise UserError(f"{where} {rate!r}: a rate is a number and kbit, mbit or gbit "
                        "(e.g. 1gbit, 250mbit)")
    bps = float(m.group(1)) * _UNIT[m.group(2)]
    if not MIN_BPS <= bps <= MAX_BPS:
        raise UserError(f"{where} {rate!r}: the local cluster shapes links between 1mbit and "
                        "40gbit")
    return bps


def gbytes(rate: str) -> float:
    """The rate in GB/s (1e9 bytes/s), as a site profile's ``fabric.bandwidth`` says."""
    return rate_bps(rate) / 8e9


@dataclass(frozen=True)
class LocalFabric:
    """The namespaces, links and rate of a cluster whose slurmctld listens on ``port``."""

    port: int
    rate: str
    nodes: tuple[str, ...]

    # ------------------------------------------------------------ names and addresses
    @property
    def subnet(self) -> str:
        """10.213.N (N from the port), so two clusters on other ports do not meet."""
        return f"10.213.{self.port % 250}"

    @property
    def controller_addr(self) -> str:
        return f"{self.subnet}.1"

    @property
    def bridge(self) -> str:
        return f"hpb{self.port}"

    def addr(self, node: str) -> str:
        return f"{self.subnet}.{11 + self.nodes.index(node)}"

    def netns(self, node: str) -> str:
        return f"hpcsuite-{self.port}-{node}"

    def host_if(self, node: str) -> str:
        """The controller's end of ``node``'s link (at most 15 characters, as Linux allows)."""
        return f"hpv{self.port}n{1 + self.nodes.index(node)}"

    def wrap(self, node: str, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv`` run in ``node``'s network namespace. nsenter enters that one only (``ip
        netns exec`` also mounts a sysfs of its own, where slurmd finds no /sys/fs/cgroup and
        stops) and execs ``argv``: the pid stays the daemon's."""
        return ("nsenter", f"--net=/run/netns/{self.netns(node)}", "--", *argv)

    # ------------------------------------------------------------ the record
    @staticmethod
    def record_path(root: Path) -> Path:
        return Path(root) / "etc" / "fabric.json"

    @classmethod
    def recorded(cls, root: Path) -> "LocalFabric | None":
        try:
            data = json.loads(cls.record_path(root).read_text())
            return cls(int(data["port"]), str(data["rate"]), tuple(data["nodes"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record(self, root: Path) -> None:
        path = self.record_path(root)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.chmod(tmp, 0o644)
        tmp.replace(path)

    # ------------------------------------------------------------ making and removing
    def exists(self) -> bool:
        return Path(f"/sys/class/net/{self.bridge}").exists()

    def create(self) -> None:
        """The bridge, the namespaces and their shaped links (what an earlier start left
        behind is removed first)."""
        if os.geteuid() != 0:
            raise UserError("--fabric makes network namespaces and shapes links with tc, which "
                            "needs root (CAP_NET_ADMIN): run `hpcsuite cluster up --fabric` as "
                            "root")
        self.remove()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.controller_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                ns, hv = self.netns(node), self.host_if(node)
                _ip("netns", "add", ns)
                _ip("link", "add", hv, "type", "veth", "peer", "name", NODE_IF, "netns", ns)
                _ip("link", "set", hv, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(node)}/24", "dev", NODE_IF)
                _ip("-n", ns, "link", "set", NODE_IF, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", self.controller_addr)
            self.shape(self.rate)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """The namespaces and the bridge, where they exist; whatever still runs in a node's
        namespace is killed first, and its link deleted (a namespace with a process in it
        outlives its name, and its link with it)."""
        for node in self.nodes:
            if Path(f"/run/netns/{self.netns(node)}").exists():
                pids = _ip("netns", "pids", self.netns(node), check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _ip("netns", "del", self.netns(node), check=False)
            if Path(f"/sys/class/net/{self.host_if(node)}").exists():
                _ip("link", "del", self.host_if(node), check=False)
        if self.exists():
            _ip("link", "del", self.bridge, check=False)

    # ------------------------------------------------------------ the running fabric
    def shape(self, rate: str, nodes: tuple[str, ...] | None = None) -> None:
        """Both ends of every node's link (or of ``nodes``') to ``rate``."""
        bps = rate_bps(rate)
        tbf = ["root", "tbf", "rate", f"{int(bps)}bit", "burst", str(BURST), "latency",
               f"{LIMIT_LATENCY_MS}ms"]
        for node in nodes or self.nodes:
            _run(["tc", "qdisc", "replace", "dev", self.host_if(node), *tbf])
            _run(["tc", "-n", self.netns(node), "qdisc", "replace", "dev", NODE_IF, *tbf])

    def set_link(self, node: str, up: bool) -> None:
        """``node``'s link down (nothing passes either way) or back up."""
        _ip("link", "set", self.host_if(node), "up" if up else "down")

    def link_up(self, node: str) -> bool:
        try:
            return Path(f"/sys/class/net/{self.host_if(node)}/operstate").read_text().strip() \
                != "down"
        except OSError:
            return False

    def counters(self, node: str) -> dict[str, int]:
        """Bytes the node sent (``tx``) and received (``rx``) over its link so far."""
        stats = Path(f"/sys/class/net/{self.host_if(node)}/statistics")
        try:      # the controller's end: what it receives, the node sent
            return {"tx": int((stats / "rx_bytes").read_text()),
                    "rx": int((stats / "tx_bytes").read_text())}
        except (OSError, ValueError):
            return {"tx": 0, "rx": 0}

    def shaped_rates(self) -> dict[str, str | None]:
        """The rate tc reports on each node's controller end (None: not shaped)."""
        out = {}
        for node in self.nodes:
            done = _run(["tc", "qdisc", "show", "dev", self.host_if(node)], check=False)
            m = re.search(r"\btbf\b.*?\brate (\S+)", done.stdout)
            out[node] = m.group(1) if m else None
        return out


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found on PATH: --fabric needs iproute2 "
                        "(apt-get install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"`{' '.join(argv)}` did not finish within 30 s") from None
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(f"--fabric: `{' '.join(argv)}` failed: "
                        f"{said[-1] if said else f'exit {done.returncode}'}")
    return done
