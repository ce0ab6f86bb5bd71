"""End the attempt in seconds when a node loses its network, naming the node.

A node whose link goes down leaves every rank waiting in an allreduce that cannot complete:
TCP retransmits for a quarter of an hour before MPI sees an error, Horovod's stall check says
nothing (every rank did submit its tensors), and Slurm cancels the job only once it declares
the node down (``SlurmdTimeout``), as a node failure that looks like any other TERM. So each
rank runs this watch: a listener that answers TCP connections on every address of its node,
published in the run directory, and a thread that, once no training step has ended for
:func:`stall_seconds`, tries every other node's listener and the Slurm controller
(``scontrol ping``). A node no peer reaches is named in the attempt's FAILED marker, with what
was seen; the batch script then ends the launcher and ``attempt end`` records the failure (a
requeue within ``train.preemption.max_failures``, or a resubmit, resumes from the last
checkpoint once the link is back). A rank whose own node reaches neither its peers nor the
controller names its own node. A stall with every node answering is not a network fault: said
once in the rank's log, and left to Horovod's stall check and the time limit.

A rank that has finished (its ``hpcsuite train`` returned: the script or the loop ended well)
says so (:func:`finished`) before its listener closes with the process. A node all of whose
ranks have finished is not watched: a rank 0 still at work after the last step (exporting a
model, waiting on MLflow, a final save, a script's work after ``run.finish()``) is not ended for
the refusals of ranks that are done.
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


def listen(record: Path, rank: int, node: str) -> socket.socket:
    """A listener on every address of this node that accepts and closes, recorded in
    ``record`` for the other ranks."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))
    server.listen(16)

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


def node_records(run_dir: Path, attempt: int, node: str) -> dict[str, list[dict]]:
    """Every other node's ranks' records, lowest rank first."""
    out: dict[str, list[dict]] = {}
    for path in RunDir(run_dir).startup(attempt).glob("net-*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("node") not in (None, node) and \
                isinstance(rec.get("rank"), int):
            out.setdefault(rec["node"], []).append(rec)
    return {n: sorted(recs, key=lambda r: r["rank"]) for n, recs in sorted(out.items())}


def peers(run_dir: Path, attempt: int, node: str) -> dict[str, dict]:
    """One record per other node (its lowest rank's)."""
    return {n: recs[0] for n, recs in node_records(run_dir, attempt, node).items()}


def finished(run_dir: Path, attempt: int, rank: int) -> None:
    """Say that this rank has finished: its node is no longer watched for it."""
    try:
        write_json_atomic(_done(run_dir, attempt, rank), {"rank": rank})
    except OSError as e:
        log.warning("network watch: could not say this rank finished: %s", e)


def _done(run_dir: Path, attempt: int, rank: int) -> Path:
    return RunDir(run_dir).net_peer(attempt, rank).with_suffix(".done")


def live_record(run_dir: Path, attempt: int, recs: list[dict]) -> dict | None:
    """The record of the node's lowest rank that has not finished (None: all have)."""
    return next((r for r in recs if not _done(run_dir, attempt, r["rank"]).exists()), None)


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


def baseline(others: dict[str, dict]) -> dict[str, dict]:
    """The peers whose port answers while training runs: the ones a stall can be judged by. A
    port that does not (a firewall between the nodes) is said once and not watched, so that a
    stall of another kind is never taken for a network fault."""
    kept = {}
    for name, rec in others.items():
        why = answers(rec, own=OWN)
        if why is None:
            kept[name] = rec
        else:
            log.warning("network watch: %s's port does not answer from here while training "
                        "runs (%s; a firewall between the nodes?): its network is not watched",
                        name, why)
    return kept


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


def probe(run_dir: Path, attempt: int, watched: dict[str, list[dict]]) -> dict[str, str]:
    """What each watched node's live rank answered, by node (those that answered left out);
    a node whose ranks have all finished leaves ``watched``. Whether a rank finished is read
    again after a failed probe: it says so before its listener closes."""
    unreachable = {}
    for name in list(watched):
        rec = live_record(run_dir, attempt, watched[name])
        why = answers(rec, own=OWN) if rec is not None else None
        if why is None:
            if rec is None:
                del watched[name]
            continue
        now = live_record(run_dir, attempt, watched[name])
        if now is rec:
            unreachable[name] = why
        elif now is None:                               # its last rank finished while asked
            del watched[name]
    return unreachable


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


def watch(run_dir: Path, rank: int, attempt: int, node: str, fail: Callable[[str], None],
          stop: threading.Event | None = None) -> threading.Thread | None:
    """Start the listener and the watch for this rank; ``fail(text)`` ends the attempt,
    ``stop`` (tests) ends the watch."""
    stop = stop or threading.Event()
    try:
        listen(RunDir(run_dir).net_peer(attempt, rank), rank, node)
    except (OSError, ImportError) as e:
        log.warning("network watch off: %s", e)
        return None

    def run() -> None:
        told, watched = False, None
        while not stop.wait(TICK):
            with _lock:
                beats = list(_beats)
            if not beats:
                continue                   # not training yet: the startup watch's time
            if watched is None:            # a step ended: every rank has published its port
                records = node_records(run_dir, attempt, node)
                kept = baseline({n: recs[0] for n, recs in records.items()})
                watched = {n: records[n] for n in kept}
                continue
            idle = time.monotonic() - beats[-1]
            if idle < stall_seconds(beats):
                told = False
                continue
            asked = len(watched)
            unreachable = probe(run_dir, attempt, watched)
            if not watched:
                log.info("no training step for %.0f s, and every other node's ranks have "
                         "finished: nothing left to watch", idle)
                return
            if not unreachable:
                if not told:
                    log.info("no training step for %.0f s, and every node answers (%s): "
                             "not a network fault", idle, ", ".join(watched) or "one node")
                    told = True
                continue
            _, text = verdict(node, idle, unreachable, controller_answers(), asked)
            fail(text)
            return

    thread = threading.Thread(target=run, name="hpcsuite-network-watch", daemon=True)
    thread.start()
    return thread
