"""The project's local Slurm cluster: idempotent up, status, and clear errors."""

import json
import socket
import subprocess

import pytest

from hpcsuite.site.cluster import LocalCluster
from hpcsuite.errors import UserError

from conftest import run_cli

pytestmark = pytest.mark.e2e


def test_up_twice_is_harmless(local_cluster):
    cluster, env = local_cluster
    pids = cluster.states()
    assert all(pids.values())
    assert cluster.up(timeout=30) == [f"cluster already up ({cluster.root})"]
    assert cluster.states() == pids
    # Both nodes still serve (a job of an earlier test may still be finishing on them).
    nodes = cluster.node_states()
    assert set(nodes) == {"node1", "node2"}
    assert set(nodes.values()) <= {"idle", "mixed", "allocated", "completing"}, nodes


def test_each_node_runs_its_tasks_on_its_own_core(local_cluster):
    """As on separate machines: node i's tasks inherit its slurmd's core, not the whole host."""
    from hpcsuite.site.cluster import node_cpus
    from hpcsuite.site.slurm_conf import NODES

    cluster, env = local_cluster
    for i, node in enumerate(NODES):
        done = subprocess.run(["srun", "-w", node, "-N", "1", "-n", "1", "grep", "Cpus_allowed_list",
                               "/proc/self/status"], env=env, capture_output=True, text=True,
                              timeout=60, check=True)
        assert done.stdout.split() == ["Cpus_allowed_list:", str(node_cpus(i)[0])], done.stdout
    assert cluster.up(timeout=30) == [f"cluster already up ({cluster.root})"]   # no re-pin note


def test_status_command(local_cluster):
    cluster, env = local_cluster
    out = run_cli("cluster", "status", "--json", env=env, check=True)
    data = json.loads(out.stdout)
    assert data["up"] and set(data["nodes"]) == {"node1", "node2"}


def test_config_stays_in_cluster_dir(local_cluster):
    cluster, env = local_cluster
    text = cluster.conf.read_text()
    assert "/etc/slurm" not in text and str(cluster.root) in text


def test_port_taken_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        c = LocalCluster(tmp_path / "c", port=port - 1 if port > 1025 else port)
        with pytest.raises(UserError, match=rf"port {port} .* already in use"):
            try:
                c.up(timeout=10)
            finally:
                c.down()


def test_not_root_is_a_clear_error(tmp_path):
    from conftest import cli_as_nobody

    proc = cli_as_nobody("cluster", "up", cluster_dir=tmp_path / "c")
    assert proc.returncode == 2, proc.stderr
    assert "runs its daemons as root" in proc.stderr and "Traceback" not in proc.stderr


def test_daemon_that_fails_reports_its_log_line_and_cleans_up(tmp_path, monkeypatch):
    """A slurmctld that dies at start: the error quotes its fatal line; munged is stopped."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "slurmctld").write_text(
        "#!/bin/sh\necho 'slurmctld: fatal: Unable to determine this slurmctld is primary' >&2\n"
        "exit 1\n")
    (shims / "slurmctld").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{__import__('os').environ['PATH']}")
    c = LocalCluster(tmp_path / "c", port=16950)
    with pytest.raises(UserError) as exc:
        c.up(timeout=10)
    assert "slurmctld exited at start: slurmctld: fatal: Unable to determine" in str(exc.value)
    assert not any(c.states().values()), "munged was left running after a failed up"


def test_accounting_runs_under_the_cluster_dir(local_cluster):
    """slurmdbd with its own MariaDB (datadir, socket, port under the cluster) answers sacct."""
    cluster, env = local_cluster
    assert cluster.accounting and cluster.states()["mariadbd"] and cluster.states()["slurmdbd"]
    cmdline = open(f"/proc/{cluster.states()['mariadbd']}/cmdline").read()
    assert f"--datadir={cluster.root}/db/data" in cmdline
    assert (cluster.root / "etc" / "slurmdbd.conf").stat().st_mode & 0o077 == 0
    out = subprocess.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["hpcsuite"], out.stderr


def test_the_clusters_profile_is_a_valid_site_profile(local_cluster, tmp_path):
    cluster, env = local_cluster
    env = {**env, **cluster.client_env()}
    spec = tmp_path / "j.yaml"
    spec.write_text("name: j\nresources: {nodes: 2, partition: other}\n")
    shown = json.loads(run_cli("config", "show", str(spec), "--json", env=env, cwd=tmp_path,
                               check=True).stdout)
    assert shown["site"]["name"] == "local"
    assert set(shown["site"]["partitions"]) == {"debug", "other"}
    spec.write_text("name: j\nresources: {nodes: 2, partition: gpu}\n")
    bad = run_cli("lint", str(spec), env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown partition 'gpu'; partitions: debug, other" in bad.stderr
