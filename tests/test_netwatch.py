"""The network watch without a cluster: when a stall is a stall, the listener and the probe,
which node is named (this node or the peer, by whether the Slurm controller answers), and the
watch ending the attempt only when a peer does not answer. tests/test_e2e_fabric.py cuts a
node's link under a real job."""

import json
import socket
import threading
import time

import pytest

from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import netwatch as nw
def test_a_stall_is_twenty_typical_steps_and_at_least_the_floor():
    assert nw.stall_seconds([]) == nw.MIN_STALL_SECONDS
    assert nw.stall_seconds([0.0, 0.1, 0.2, 0.3]) == nw.MIN_STALL_SECONDS
    assert nw.stall_seconds([0.0, 2.0, 4.0, 6.0, 106.0]) == pytest.approx(40.0)  # median 2 s


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_listener_answers_and_a_closed_port_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(nw, "node_addresses", lambda: ["127.0.0.1"])
    record = tmp_path / "net-0.json"
    server = nw.listen(record, 0, "node1")
    rec = json.loads(record.read_text())
    assert rec == {"rank": 0, "node": "node1", "port": server.getsockname()[1],
                   "addrs": ["127.0.0.1"]}
    assert nw.answers(rec) is None
    server.close()
    said = nw.answers({"addrs": ["127.0.0.1"], "port": closed_port()}, timeout=1)
    assert said.startswith("127.0.0.1:") and "refused" in said.lower()
    assert nw.answers({"addrs": [], "port": 1}) == "no address recorded"


def record(tmp_path, node, port=1, rank=0):
    path = RunDir(tmp_path).attempt_file(0, "net", node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "node": node, "port": port,
                                "addrs": ["127.0.0.1"]}))


def test_a_node_watches_its_two_neighbours_in_the_ring(tmp_path):
    """Issue 53, point 3: at any size, a node asks the next and the previous node in Slurm's
    order, reading their two records, not every node's."""
    nodes = [f"node{i}" for i in range(1, 33)]
    for name in nodes:
        record(tmp_path, name)
    ring = nw.Ring(tmp_path, 0, "node1", nodes)
    assert ring.neighbours() == ["node2", "node32"]
    assert set(ring.records) == {"node2", "node32"}          # two records read
    assert nw.Ring(tmp_path, 0, "node7", nodes).neighbours() == ["node8", "node6"]
    assert nw.Ring(tmp_path, 0, "node1", nodes[:2]).neighbours() == ["node2"]
    assert nw.Ring(tmp_path, 0, "node1", nodes[:1]).neighbours() == []
    assert nw.Ring(tmp_path, 0, "node1", []).neighbours() == []     # outside Slurm
    # a neighbour that finished, one without a record, one broken: the next along the ring
    nw.finished(tmp_path, 0, "node8")
    RunDir(tmp_path).attempt_file(0, "net", "node9").unlink()
    RunDir(tmp_path).attempt_file(0, "net", "node6").write_text("{broken")
    assert nw.Ring(tmp_path, 0, "node7", nodes).neighbours() == ["node10", "node5"]


def test_who_is_named():
    cut, text = nw.verdict("node1", 21.4, {"node2": "10.0.0.2:5 timed out after 3 s"}, True)
    assert cut == ["node2"]
    first, second = text.splitlines()
    assert first.startswith("error: network: node2 unreachable from node1 (1 of the 1 node(s) "
                            "asked; the Slurm controller answers here); no training step for "
                            "21 s: the ranks stalled in the allreduce")
    assert first.endswith("tried from node1: node2: 10.0.0.2:5 timed out after 3 s")
    assert second.startswith("error: the last checkpoint is kept: once the link is back")
    cut, text = nw.verdict("node2", 22, {"node1": "timed out"}, False)   # its own link is down
    assert cut == ["node2"] and "node2 itself lost its network" in text
    cut, _ = nw.verdict("node1", 22, {"node2": "x", "node3": "y"}, None)
    assert cut == ["node2", "node3"]
    # a refusal: node2 answered, its rank's process is gone (not a network fault)
    cut, text = nw.verdict("node1", 22, {"node2": "10.0.0.2:5 Connection refused"}, True)
    assert cut == ["node2"] and text.startswith("error: the ranks on node2 are gone (the node")


@pytest.fixture(autouse=True)
def stop_watches(monkeypatch):
    """Each test's watch ends with it (the watch is a daemon thread of the process), before
    monkeypatch puts the real controller_answers back: a watch left running would call it in a
    later test, whatever that test has made of slurm.call."""
    stop = threading.Event()
    STOPS.append(stop)
    yield
    stop.set()
    while THREADS:
        THREADS.pop().join(5)


STOPS: list[threading.Event] = []
THREADS: list[threading.Thread] = []


def run_watch(tmp_path, monkeypatch, peer_port, close=None):
    monkeypatch.setattr(nw, "node_addresses", lambda: ["127.0.0.1"])
    monkeypatch.setattr(nw, "MIN_STALL_SECONDS", 0.3)
    monkeypatch.setattr(nw, "TICK", 0.05)
    monkeypatch.setattr(nw, "controller_answers", lambda: True)
    record(tmp_path, "node2", peer_port, rank=1)
    failed = []
    done = threading.Event()
    nw.beat()
    nw.beat()
    thread = nw.watch(tmp_path, 0, 0, "node1", lambda text: (failed.append(text), done.set()),
                      STOPS[-1], nodes=["node1", "node2"])
    if thread is not None:
        THREADS.append(thread)
    if close is not None:       # the peer answered while training ran; now it is gone
        time.sleep(0.2)
        close()
    done.wait(3)
    return failed


def test_a_peer_gone_in_a_stall_ends_the_attempt(tmp_path, monkeypatch):
    peer = socket.socket()
    peer.bind(("127.0.0.1", 0))
    peer.listen(8)
    failed = run_watch(tmp_path, monkeypatch, peer.getsockname()[1], close=peer.close)
    assert len(failed) == 1 and "error: the ranks on node2 are gone" in failed[0]  # refused


def test_a_peer_that_never_answered_is_not_watched(tmp_path, monkeypatch, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="hpcsuite.runtime.observe.netwatch"):
        failed = run_watch(tmp_path, monkeypatch, closed_port())   # a firewall, say
        time.sleep(0.5)
    assert failed == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("network watch: node2's port does not answer")
    assert json.loads(RunDir(tmp_path).attempt_file(0, "net", "node1").read_text())["node"] == "node1"


def test_a_stall_with_every_peer_answering_is_left_alone(tmp_path, monkeypatch, caplog):
    import logging

    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen(8)
        with caplog.at_level(logging.INFO, logger="hpcsuite.runtime.observe.netwatch"):
            failed = run_watch(tmp_path, monkeypatch, peer.getsockname()[1])
            time.sleep(0.5)
    assert failed == []
    said = [r.getMessage() for r in caplog.records if "not a network fault" in r.getMessage()]
    assert len(said) == 1 and "the neighbours answer (node2)" in said[0]


def listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_a_peer_that_finished_is_not_taken_for_one_that_died(tmp_path, monkeypatch, caplog):
    """Issue 51, point 1: rank 0 still at work after its last step (exporting a model) while
    node2's rank has finished and exited: its refusal is not a failure."""
    import logging

    peer = listening()

    def finish_and_exit():
        nw.finished(tmp_path, 0, "node2")  # what the lifecycle's over() does first
        peer.close()

    with caplog.at_level(logging.INFO, logger="hpcsuite.runtime.observe.netwatch"):
        failed = run_watch(tmp_path, monkeypatch, peer.getsockname()[1], close=finish_and_exit)
        time.sleep(0.5)
    assert failed == []
    said = [r.getMessage() for r in caplog.records]
    assert any("every other node has finished or is not watched: nothing left to watch" in s
               for s in said)


def test_a_neighbour_that_finished_is_replaced_by_the_next_along_the_ring(tmp_path, monkeypatch):
    """node2 finished and closed its port; node3, the next along the ring, is asked instead,
    and a refusal there (its rank died without finishing) is a verdict naming node3."""
    first, second = listening(), listening()
    record(tmp_path, "node3", second.getsockname()[1], rank=2)
    port = second.getsockname()[1]
    monkeypatch.setattr(nw, "node_addresses", lambda: ["127.0.0.1"])
    monkeypatch.setattr(nw, "MIN_STALL_SECONDS", 0.3)
    monkeypatch.setattr(nw, "TICK", 0.05)
    monkeypatch.setattr(nw, "controller_answers", lambda: True)
    record(tmp_path, "node2", first.getsockname()[1], rank=1)
    failed, done = [], threading.Event()
    nw.beat()
    nw.beat()
    THREADS.append(nw.watch(tmp_path, 0, 0, "node1", lambda t: (failed.append(t), done.set()),
                            STOPS[-1], nodes=["node1", "node2", "node3"]))
    time.sleep(0.2)
    nw.finished(tmp_path, 0, "node2")
    first.close()
    time.sleep(0.6)
    second.close()                          # node3's rank ended without finishing: it died
    done.wait(3)
    assert len(failed) == 1 and "error: the ranks on node3 are gone" in failed[0], failed
    assert f"127.0.0.1:{port} " in failed[0], failed


def test_a_long_stall_with_every_neighbour_answering_backs_off(tmp_path, monkeypatch):
    """A 60 s save costs a node a few probes: asked again after 2, 4, 8, then every 16 s
    (here a hundred times faster), not at every tick."""
    asked = []
    monkeypatch.setattr(nw, "answers", lambda rec, own=frozenset(): asked.append(time.monotonic()))
    monkeypatch.setattr(nw, "node_addresses", lambda: ["127.0.0.1"])
    monkeypatch.setattr(nw, "MIN_STALL_SECONDS", 0.2)
    monkeypatch.setattr(nw, "TICK", 0.02)
    monkeypatch.setattr(nw, "MAX_BACKOFF", 0.32)
    record(tmp_path, "node2", 1, rank=1)
    nw.beat()
    nw.beat()
    THREADS.append(nw.watch(tmp_path, 0, 0, "node1", lambda t: None, STOPS[-1],
                            nodes=["node1", "node2"]))
    time.sleep(1.6)                   # ~1.4 s of stall: 70 ticks
    STOPS[-1].set()
    gaps = [round(b - a, 2) for a, b in zip(asked[1:], asked[2:])]   # asked[0]: the baseline
    assert 5 <= len(asked) - 1 <= 10, gaps
    assert gaps[:4] == pytest.approx([0.02, 0.04, 0.08, 0.16], abs=0.015), gaps
    assert all(g == pytest.approx(0.32, abs=0.04) for g in gaps[4:]), gaps


def test_the_listener_takes_the_systems_backlog():
    assert nw.backlog() >= 128


def test_a_refusal_of_one_address_of_several_is_no_verdict_of_gone():
    """Issue 51, point 9: a real cut where one address (docker0's, which refuses locally) was
    also asked is a network fault, not ranks that are gone."""
    cut, text = nw.verdict("node1", 22, {"node2": "10.0.0.2:5 timed out after 3 s; "
                                                  "172.17.0.1:5 Connection refused"}, True, 3)
    assert cut == ["node2"] and text.startswith("error: network: node2 unreachable from node1 "
                                                "(1 of the 3 node(s) asked;"), text
    assert "are gone" not in text
    # one node cut, another's rank gone: each said as what it is
    cut, text = nw.verdict("node1", 22, {"node2": "10.0.0.2:5 timed out after 3 s",
                                         "node3": "10.0.0.3:5 Connection refused"}, True, 3)
    assert cut == ["node2"] and "the ranks on node3 are gone" in text


def test_a_node_names_itself_only_when_it_reaches_none_of_its_peers():
    """A slow or failed `scontrol ping` with 1 of 124 peers unreachable names that peer."""
    cut, text = nw.verdict("node1", 22, {"node7": "10.0.0.7:5 timed out after 3 s"}, False, 124)
    assert cut == ["node7"] and "itself" not in text
    assert "node7 unreachable from node1 (1 of the 124 node(s) asked; the Slurm controller " \
           "does not answer here)" in text
    unreachable = {f"node{i}": "timed out" for i in range(2, 6)}
    cut, text = nw.verdict("node1", 22, unreachable, False, 4)
    assert cut == ["node1"] and "node1 itself lost its network (it reaches none of its 4 " in text


def test_an_address_this_node_has_too_is_not_asked():
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen(8)
        port = peer.getsockname()[1]
        rec = {"addrs": ["127.0.0.1", "127.0.0.9"], "port": port}
        said = nw.answers(rec, timeout=1, own=frozenset({"127.0.0.1"}))   # shared: not asked
        assert said is not None and said.startswith("127.0.0.9:") and "127.0.0.1" not in said
        # nodes sharing one host have every address in common: then all are asked
        assert nw.answers(rec, timeout=1, own=frozenset(rec["addrs"])) is None


def test_the_addresses_watched_are_those_the_mpi_uses():
    assert nw._matches("eth1", "10.1.2.3", ["10.1.0.0/16"])
    assert nw._matches("ib0", "192.168.0.5", ["eth0", "ib0"])
    assert not nw._matches("docker0", "172.17.0.1", ["10.1.0.0/16", "ib0"])
    everything = nw.node_addresses({})
    assert nw.node_addresses({"OMPI_MCA_btl_tcp_if_include": "nosuch0"}) == []
    assert nw.node_addresses({"OMPI_MCA_btl_tcp_if_exclude": "0.0.0.0/0"}) == []
    assert nw.node_addresses({"OMPI_MCA_btl_tcp_if_include": "0.0.0.0/0"}) == everything
