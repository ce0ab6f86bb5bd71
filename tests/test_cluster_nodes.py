"""`cluster up --nodes N` without starting it: the ports, names, addresses and config of N
virtual nodes, how many a cluster has once made, and the one-line errors.
tests/test_e2e_cluster_nodes.py starts one of 4 nodes and runs a job across it."""

import pytest

from conftest import run_cli
from hpcsuite.site import fabric as fb
from hpcsuite.site.cluster import LocalCluster, node_cpus
from hpcsuite.site.slurm_conf import (DB_OFFSET, DBD_OFFSET, MAX_NODES, declared, node_names,
                                      node_port, render_conf, render_profile)


def test_two_nodes_keep_their_ports_and_64_never_meet_the_databases():
    assert [node_port(16817, i) for i in range(2)] == [16818, 16819]
    ports = [node_port(65000, i) for i in range(MAX_NODES)]
    taken = {65000, 65000 + DB_OFFSET, 65000 + DBD_OFFSET}
    assert len(set(ports)) == MAX_NODES and not taken & set(ports) and max(ports) <= 65535
    assert ports[2] == 65000 + DBD_OFFSET + 1


def test_n_nodes_in_slurm_conf_and_both_partitions(tmp_path):
    c = LocalCluster(tmp_path, port=17000, accounting=False, nodes=8)
    assert c.nodes == node_names(8) == tuple(f"node{i}" for i in range(1, 9))
    conf = render_conf(tmp_path, 17000, "vm", tmp_path / "m", False, 0, c.addresses())
    lines = [l for l in conf.splitlines() if l.startswith("NodeName=")]
    assert [l.split()[0] for l in lines] == [f"NodeName=node{i}" for i in range(1, 9)]
    assert [l.split("Port=")[1].split()[0] for l in lines] == \
        [str(node_port(17000, i)) for i in range(8)]
    for partition in ("debug", "other"):
        line = next(l for l in conf.splitlines() if l.startswith(f"PartitionName={partition} "))
        assert f"Nodes={','.join(node_names(8))} " in line
    assert [d.name for d in c.daemons() if d.program == "slurmd"] == \
        [f"slurmd-node{i}" for i in range(1, 9)]
    ports = c.ports()
    assert len(set(ports.values())) == len(ports)
    # node i is pinned to this machine's cores in turn
    assert [d.cpus for d in c.daemons() if d.program == "slurmd"] == \
        [node_cpus(i) for i in range(8)]


def test_a_cluster_once_made_keeps_its_nodes_for_every_command(tmp_path):
    assert LocalCluster(tmp_path, accounting=False).nodes == ("node1", "node2")   # a new one
    made = LocalCluster(tmp_path, accounting=False, nodes=5)
    made.conf.parent.mkdir(parents=True)
    made.conf.write_text(render_conf(tmp_path, made.port, "vm", tmp_path / "m", False, 0,
                                     made.addresses()))
    assert declared(made.conf) == (5, 0)
    # `cluster down`, `status`, `link`: no --nodes, the cluster's own
    assert LocalCluster(tmp_path, accounting=False).nodes == node_names(5)
    # not running: `up --nodes 3` makes it anew with 3
    assert LocalCluster(tmp_path, accounting=False, nodes=3).nodes == node_names(3)


def test_a_fabric_of_64_nodes_has_names_linux_takes_and_an_address_each(tmp_path):
    c = LocalCluster(tmp_path, port=65000, accounting=False, nodes=MAX_NODES, fabric="1gbit")
    f = c.asked_fabric
    assert f.nodes == node_names(MAX_NODES)
    assert all(len(f.host_if(n)) <= 15 for n in f.nodes)
    assert len({f.host_if(n) for n in f.nodes}) == MAX_NODES
    addrs = c.addresses()[1]
    assert len(set(addrs.values())) == MAX_NODES and addrs["node64"] == f"{f.subnet}.74"


def test_the_profile_says_how_many_nodes():
    assert "(two 1-core nodes on this machine)" in render_profile()
    assert "(16 1-core nodes on this machine)" in render_profile(nodes=16)
    assert "its nodes are one machine" in render_profile(nodes=16)
    assert "node1 and node2 are one machine" in render_profile()


@pytest.mark.parametrize("nodes", ["1", "65", "many"])
def test_a_node_count_out_of_range_is_one_line(tmp_path, nodes):
    proc = run_cli("cluster", "up", "--nodes", nodes,
                   env={"HPCSUITE_CLUSTER_DIR": str(tmp_path / "c")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--nodes" in proc.stderr and not (tmp_path / "c").exists()
