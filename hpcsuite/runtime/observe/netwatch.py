"""End the attempt in seconds when a node loses its network, naming the node.

A node whose link goes down leaves every rank waiting in an allreduce that cannot complete:
TCP retransmits for a quarter of an hour before MPI sees an error, Horovod's stall check says
nothing (every rank did submit its tensors), and Slurm cancels the job only once it declares
the node down (``SlurmdTimeout``), as a node failure that looks like any other TERM. So one
rank of each node (its local rank 0) runs this watch: a listener that answers TCP connections
on every address of its node, published in the run directory as the node's one record, and a
thread that, once no training step has ended for :func:`stall_seconds`, tries its two
neighbours in the ring of the job's nodes (the next and the previous in Slurm's node list) and,
when one does not answer, the Slurm controller (``scontrol ping``). A node its neighbours do not
reach is named in the attempt's FAILED marker, with what was seen; the batch script then ends
the launcher and ``attempt end`` records the failure (a requeue within
``train.preemption.max_failures``, or a resubmit, resumes from the last checkpoint once the link
is back). A node that reaches neither neighbour nor the controller names itself. A stall with
every neighbour answering is not a network fault: said once in the rank's log, asked again
after 2, 4, 8, then every 16 s (a checkpoint save of minutes costs a few connections), and left
to Horovod's stall check and the time limit.

Why the ring and not every node: at 1,000 ranks every rank probing every node was ~62,000
connections a second during a long save, enough to drop SYNs at a listener and name a healthy
node. Here a job makes at most 2 connections per node per probe, each node reads two records
(once) and stats two markers per probe, and one ``scontrol ping`` per node comes only with a
verdict: the total grows as the nodes, not their square (bench/scale.py measures it).

The watch stops when training is over (:mod:`hpcsuite.runtime.observe.lifecycle`): the node says
so first (:func:`finished`), so a neighbour still watching skips it, and a rank 0 still at work
after the last step (exporting a model, waiting on MLflow, a final save, a script's work after
its last step) is not ended for the refusals of ranks that are done.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

from ...runs.results import write_json_atomic
from ...runs.rundir import RunDir

log = logging.getLogger(__name__)

MIN_STALL_SECONDS = 20.0   # no step for this long (at least) before looking at the network
STEP_FACTOR = 20           # ... or this many typical steps, whichever is longer
PROBE_SECONDS = 3.0        # a node's listener that does not accept within this: unreachable
CONTROLLER_SECONDS = 5.0   # scontrol ping's bound
TICK = 2.0

OWN: frozenset = frozenset()   # this node's addresses (listen() records them)
_beats: list[float] = []   # when the last steps ended (monotonic), the newest last
_lock = threading.Lock()


def beat() -> None:
    """A training step ended (the loops call it once per optimizer step)."""
    with _lock:
        _beats.append(time.monotonic())
        del _beats[:-64]


def stall_seconds(beats: list[float]) -> float:
    """How long without a step is a stall: :data:`STEP_FACTOR` typical steps, at least
    :data:`MIN_STALL_SECONDS`."""
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    typical = statistics.median(gaps) if gaps else 0.0
    return max(MIN_STALL_SECONDS, STEP_FACTOR * typical)


def node_addresses(env: dict | None = None) -> list[str]:
    """This node's IPv4 addresses other than loopback (psutil: every interface), those of the
    interfaces the MPI uses when it is told (Open MPI's btl_tcp_if_include/exclude, which
    mpirun hands the ranks as OMPI_MCA_*): the links a cut would stall."""
    import psutil

    env = os.environ if env is None else env
    include = _words(env.get("OMPI_MCA_btl_tcp_if_include"))
    exclude = _words(env.get("OMPI_MCA_btl_tcp_if_exclude"))
    return sorted({a.address for name, addrs in psutil.net_if_addrs().items() for a in addrs
                   if a.family == socket.AF_INET and not a.address.startswith("127.")
                   and (not include or _matches(name, a.address, include))
                   and not _matches(name, a.address, exclude)})


def _words(value: str | None) -> list[str]:
    return [w.strip() for w in (value or "").split(",") if w.strip()]


def _matches(name: str, address: str, patterns: list[str]) -> bool:
    """Whether interface ``name`` with ``address`` is one of ``patterns`` (names, or CIDR
    subnets, as btl_tcp_if_include takes them)."""
    import ipaddress

    for pattern in patterns:
        if "/" in pattern:
            try:
                if ipaddress.ip_address(address) in ipaddress.ip_network(pattern, strict=False):
                    return True
            except ValueError:
                continue
        elif name == pattern:
            return True
    return False


def backlog() -> int:
    """The system's listen backlog (``net.core.somaxconn``): a burst of probes waits in it."""
    try:
        return max(int(Path("/proc/sys/net/core/somaxconn").read_text()), 16)
    except (OSError, ValueError):
        return socket.SOMAXCONN


def listen(record: Path, rank: int, node: str) -> socket.socket:
    """A listener on every address of this node that accepts and closes, recorded in
    ``record`` for the neighbours."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))
    server.listen(backlog())

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                return

    threading.Thread(target=serve, name="hpcsuite-net-listener", daemon=True).start()
    record.parent.mkdir(parents=True, exist_ok=True)
    global OWN
    addrs = node_addresses()
    OWN = frozenset(addrs)
    write_json_atomic(record, {"rank": rank, "node": node, "port": server.getsockname()[1],
                               "addrs": addrs})
    return server


class Ring:
    """This node's view of the others: the job's nodes in order, each node's record read once
    (when first needed), and which have finished. Its neighbours are the nearest nodes before
    and after it in the ring that have a record, were reachable at the start and have not
    finished: two at most, whatever the job's size."""

    def __init__(self, run_dir: Path, attempt: int, node: str, nodes: list[str]):
        self.run, self.attempt, self.node = RunDir(run_dir), attempt, node
        self.nodes = list(dict.fromkeys(nodes))
        self.records: dict[str, dict | None] = {}
        self.left: set[str] = set()           # finished, or never watchable

    def record(self, name: str) -> dict | None:
        if name not in self.records:
            try:
                rec = json.loads(self.run.attempt_file(self.attempt, "net", name).read_text())
            except (OSError, ValueError):
                rec = None
            self.records[name] = rec if isinstance(rec, dict) and "port" in rec else None
        return self.records[name]

    def done(self, name: str) -> bool:
        return _done(self.run.path, self.attempt, name).exists()

    def neighbours(self) -> list[str]:
        """The nearest live node after this one in the ring, and before it (one when they are
        the same node; none when every other node has finished)."""
        if self.node not in self.nodes:
            return []
        i, n = self.nodes.index(self.node), len(self.nodes)
        found: list[str] = []
        for direction in (1, -1):
            for k in range(1, n):
                name = self.nodes[(i + direction * k) % n]
                if name in self.left:
                    continue
                if self.record(name) is None or self.done(name):
                    self.left.add(name)
                    continue
                if name not in found:
                    found.append(name)
                break
        return found


def finished(run_dir: Path, attempt: int, node: str) -> None:
    """Say that this node's watch has finished: the neighbours no longer ask it."""
    try:
        write_json_atomic(_done(run_dir, attempt, node), {"node": node})
    except OSError as e:
        log.warning("network watch: could not say this node finished: %s", e)


def _done(run_dir: Path, attempt: int, node: str) -> Path:
    return RunDir(run_dir).attempt_file(attempt, "net", node).with_suffix(".done")


def answers(rec: dict, timeout: float = PROBE_SECONDS, own: frozenset = frozenset()
            ) -> str | None:
    """None when one of the peer's addresses accepts a connection; else what each address
    did. An address this node has too (docker0's 172.17.0.1 on every node) reaches this node,
    not the peer: it is left out unless the peer has no other (nodes sharing one host)."""
    addrs = rec.get("addrs") or []
    theirs = [a for a in addrs if a not in own] or addrs
    said = []
    for addr in theirs:
        try:
            with socket.create_connection((addr, rec["port"]), timeout=timeout):
                return None
        except socket.timeout:
            said.append(f"{addr}:{rec['port']} timed out after {timeout:.0f} s")
        except OSError as e:
            said.append(f"{addr}:{rec['port']} {e.strerror or e}")
    return "; ".join(said) or "no address recorded"


def refused(why: str) -> bool:
    """Whether every address asked refused the connection (the node is up, its rank gone)."""
    parts = [p for p in why.split("; ") if p]
    return bool(parts) and all("refused" in p.lower() for p in parts)


def baseline(ring: Ring) -> None:
    """Leave out the neighbours whose port does not answer while training runs (a firewall
    between the nodes): said once each, so that a stall of another kind is never taken for a
    network fault. The next node along the ring is watched instead."""
    while True:
        silent = {}
        for name in ring.neighbours():
            why = answers(ring.record(name), own=OWN)
            if why is not None:
                silent[name] = why
        if not silent:
            return
        for name, why in silent.items():
            log.warning("network watch: %s's port does not answer from here while training "
                        "runs (%s; a firewall between the nodes?): its network is not watched",
                        name, why)
            ring.left.add(name)


def controller_answers(timeout: float = CONTROLLER_SECONDS) -> bool | None:
    """Whether the Slurm controller answers ``scontrol ping`` from here (None: cannot tell)."""
    from ... import slurm
    from ...errors import UserError

    try:
        done = slurm.call(["scontrol", "ping"], timeout=timeout, env=dict(os.environ),
                          check=False)
    except slurm.TimedOut:
        return False
    except UserError:            # no scontrol here, or a slurm.conf it cannot read
        return None
    return " is UP" in done.stdout


def probe(ring: Ring) -> tuple[dict[str, str], int]:
    """(what each neighbour that did not answer said, by node; how many were asked). A
    neighbour that finished while it was asked (it says so before its listener closes) is left
    for the next one along the ring, which is asked then."""
    unreachable: dict[str, str] = {}
    asked: set[str] = set()
    while True:
        todo = [n for n in ring.neighbours() if n not in asked]
        if not todo:
            return unreachable, len(asked)
        for name in todo:
            asked.add(name)
            why = answers(ring.record(name), own=OWN)
            if why is None:
                continue
            if ring.done(name):                       # it finished while asked
                ring.left.add(name)
                asked.discard(name)
            else:
                unreachable[name] = why


def verdict(node: str, idle: float, unreachable: dict[str, str],
            controller: bool | None, asked: int | None = None) -> tuple[list[str], str]:
    """(the nodes that lost their network, the failure's text) from what this node saw of the
    ``asked`` peers it probed (default: just the unreachable ones). This node names itself
    only when it reached none of its peers and the controller does not answer it either; a
    node is "gone" only when every address of it refused."""
    seen = "; ".join(f"{n}: {why}" for n, why in sorted(unreachable.items()))
    ctl = {True: "answers", False: "does not answer", None: "could not be asked"}[controller]
    asked = len(unreachable) if asked is None else asked
    gone = sorted(n for n, why in unreachable.items() if refused(why))
    lost = sorted(n for n in unreachable if n not in gone)
    if not lost:
        # the node answered, with a refusal: its network is up, the rank's process is gone
        cut = gone
        where = (f"the ranks on {', '.join(cut)} are gone (the node answers, but their watch's "
                 "port refuses connections: the process ended or was killed)")
    else:
        alone = controller is False and len(unreachable) >= asked
        cut = [node] if alone else lost
        where = "network: " + (
            f"{node} itself lost its network (it reaches none of its {asked} peer(s) and the "
            "Slurm controller does not answer it)" if alone else
            f"{', '.join(cut)} unreachable from {node} ({len(lost)} of the {asked} node(s) "
            f"asked; the Slurm controller {ctl} here)")
        if gone:
            where += (f"; the ranks on {', '.join(gone)} are gone (their node refuses the "
                      "watch's port)")
    text = (f"error: {where}; no training step for {idle:.0f} s: the ranks stalled in "
            "the allreduce (Horovod's stall check stays silent while every rank waits in MPI, "
            "and MPI's TCP retries run for minutes); "
            f"tried from {node}: {seen}\n"
            "error: the last checkpoint is kept: once the link is back, resubmit the same "
            "spec (or allow train.preemption.max_failures) to resume from it")
    return cut, text


MAX_BACKOFF = 16.0   # seconds between probes, at most, in a stall every neighbour answers


def watch(run_dir: Path, rank: int, attempt: int, node: str, fail: Callable[[str], None],
          stop: threading.Event, nodes: list[str] | tuple[str, ...] = ()) -> threading.Thread | None:
    """Start this node's listener and watch (one rank of each node runs it; ``nodes``: the
    job's nodes in Slurm's order, :attr:`hpcsuite.world.World.nodes`); ``fail(text)`` ends
    the attempt; ``stop`` ends the watch (training is over)."""
    try:
        listen(RunDir(run_dir).attempt_file(attempt, "net", node), rank, node)
    except (OSError, ImportError) as e:
        log.warning("network watch off: %s", e)
        return None
    ring = Ring(run_dir, attempt, node, list(nodes))

    def run() -> None:
        told, started, wait, due = False, False, TICK, 0.0
        while not stop.wait(TICK):
            with _lock:
                beats = list(_beats)
            if not beats:
                continue                   # not training yet: the startup watch's time
            if not started:                # a step ended: every node has published its port
                baseline(ring)
                started = True
                continue
            now = time.monotonic()
            idle = now - beats[-1]
            if idle < stall_seconds(beats):
                told, wait, due = False, TICK, 0.0
                continue
            if now < due:
                continue
            unreachable, asked = probe(ring)
            if not asked:
                log.info("no training step for %.0f s, and every other node has finished or "
                         "is not watched: nothing left to watch", idle)
                return
            if not unreachable:
                if not told:
                    log.info("no training step for %.0f s, and the neighbours answer (%s): "
                             "not a network fault", idle, ", ".join(ring.neighbours()))
                    told = True
                due, wait = now + wait, min(2 * wait, MAX_BACKOFF)
                continue
            if stop.is_set():
                return                     # training ended while the neighbours were asked
            _, text = verdict(node, idle, unreachable, controller_answers(), asked)
            fail(text)
            return

    thread = threading.Thread(target=run, name="hpcsuite-network-watch", daemon=True)
    thread.start()
    return thread
