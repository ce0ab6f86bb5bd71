"""`cluster up --fabric RATE` without starting it: the rate's syntax, the names and addresses
of the nodes' namespaces and links, what slurm.conf, slurmdbd.conf and the site profile say
on a fabric, and the one-line errors (a bad rate, no root, no running fabric).
tests/test_e2e_fabric.py starts one and runs jobs across it."""

import json

import pytest

from conftest import cli_as_nobody, run_cli
from hpcsuite.errors import UserError
from hpcsuite.site import fabric as fb
from hpcsuite.site.cluster import LocalCluster
from hpcsuite.site.slurm_conf import NODES, render_conf, render_dbd_conf, render_profile


@pytest.mark.parametrize("rate, bps", [("1gbit", 1e9), ("250mbit", 2.5e8), ("1.5gbit", 1.5e9),
                                       ("500kbit", None), ("2000kbit", 2e6), ("40gbit", 4e10)])
def test_rates(rate, bps):
    if bps is None:
        with pytest.raises(UserError, match="between 1mbit and 40gbit"):
            fb.rate_bps(rate)
    else:
        assert fb.rate_bps(rate) == bps


@pytest.mark.parametrize("rate", ["fast", "100", "100mb", "1 gbit", "-1gbit", ""])
def test_a_bad_rate_is_one_line_naming_the_option(rate):
    with pytest.raises(UserError) as e:
        fb.rate_bps(rate, "cluster fabric")
    assert str(e.value).startswith(f"cluster fabric {rate!r}: a rate is a number and kbit")
    assert "\n" not in str(e.value)


def test_names_fit_linux_and_addresses_are_the_ports():
    f = fb.LocalFabric(16817, "1gbit", NODES)
    names = [f.bridge, *map(f.host_if, NODES), fb.NODE_IF]
    assert all(len(n) <= 15 for n in names) and len(set(names)) == len(names)
    assert f.controller_addr == "10.213.67.1"
    assert [f.addr(n) for n in NODES] == ["10.213.67.11", "10.213.67.12"]
    other = fb.LocalFabric(16917, "1gbit", NODES)
    assert other.subnet != f.subnet and other.bridge != f.bridge
    assert f.netns("node2") == "hpcsuite-16817-node2"
    assert f.wrap("node1", ("slurmd", "-D")) == (
        "nsenter", "--net=/run/netns/hpcsuite-16817-node1", "--", "slurmd", "-D")
    assert fb.gbytes("250mbit") == pytest.approx(0.03125)


def test_the_record_round_trips(tmp_path):
    (tmp_path / "etc").mkdir()
    assert fb.LocalFabric.recorded(tmp_path) is None
    f = fb.LocalFabric(16817, "250mbit", NODES)
    f.record(tmp_path)
    assert fb.LocalFabric.recorded(tmp_path) == f
    fb.LocalFabric.record_path(tmp_path).write_text("{not json")
    assert fb.LocalFabric.recorded(tmp_path) is None


def test_config_files_on_a_fabric(tmp_path):
    c = LocalCluster(tmp_path, port=16817, accounting=True, fabric="250mbit")
    ctl, nodes = c.addresses()
    conf = render_conf(tmp_path, 16817, "vm", tmp_path / "m", True, 0, c.addresses())
    assert "SlurmctldHost=vm(10.213.67.1)" in conf
    assert "AccountingStorageHost=10.213.67.1" in conf       # sacct from a node reaches it
    assert "NodeName=node1 NodeHostname=vm NodeAddr=10.213.67.11 " in conf
    assert "NodeName=node2 NodeHostname=vm NodeAddr=10.213.67.12 " in conf
    assert "DbdAddr=10.213.67.1" in render_dbd_conf(tmp_path, 16817, "vm", tmp_path, "pw", ctl)
    slurmd = [d for d in c.daemons() if d.name.startswith("slurmd-")]
    assert [d.argv[:2] for d in slurmd] == [
        ("nsenter", f"--net=/run/netns/hpcsuite-16817-{n}") for n in NODES]
    assert all(d.program == "slurmd" for d in slurmd)
    plain = LocalCluster(tmp_path / "p", port=16817, accounting=True)
    assert plain.fabric is None and plain.addresses() == ("127.0.0.1", {n: "127.0.0.1"
                                                                         for n in NODES})
    assert "SlurmctldHost=vm(127.0.0.1)" in render_conf(tmp_path, 16817, "vm", tmp_path, True)


def test_the_profile_of_a_fabric_names_its_rate(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(render_profile(fabric="250mbit"))
    spec = tmp_path / "j.yaml"
    spec.write_text("name: j\nresources: {nodes: 2}\n")
    shown = json.loads(run_cli("config", "show", str(spec), "--json", cwd=tmp_path, check=True,
                               env={"HPCSUITE_PROFILE": str(profile), "PATH": "/usr/bin:/bin",
                                    "HOME": str(tmp_path)}).stdout)
    fabric = shown["site"]["fabric"]
    assert fabric["bandwidth"] == pytest.approx(0.03125)
    assert "cluster up --fabric 250mbit" in fabric["source"]


def test_cli_refuses_a_bad_rate_and_a_cluster_without_a_fabric(tmp_path):
    env = {"HPCSUITE_CLUSTER_DIR": str(tmp_path / "c"), "PATH": "/usr/sbin:/usr/bin:/bin",
           "HOME": str(tmp_path)}
    for args, said in [(("cluster", "up", "--fabric", "fast"), "--fabric 'fast': a rate is"),
                       (("cluster", "fabric", "10"), "cluster fabric '10': a rate is"),
                       (("cluster", "fabric", "1gbit"), "is not running with a fabric"),
                       (("cluster", "link", "node2", "down"), "is not running with a fabric")]:
        out = run_cli(*args, env=env, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    bad = run_cli("cluster", "link", "node2", "sideways", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "'sideways' is not one of 'down', 'up'" in bad.stderr


def test_without_root_fabric_says_it_needs_root_in_one_line(tmp_path):
    proc = cli_as_nobody("cluster", "up", "--fabric", "1gbit", cluster_dir=tmp_path / "c")
    assert proc.returncode == 2, proc.stderr
    assert "--fabric makes network namespaces and shapes links with tc, which needs root" \
        in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
