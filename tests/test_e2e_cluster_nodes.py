"""End to end: `hpcsuite cluster up --nodes 4 --fabric RATE` through the command line, a
4-rank Horovod job across its four nodes, status and link on every node, and `down` leaves
nothing. Its own cluster: the suite's clusters keep their 2 nodes."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import TEST_PORT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SPEC = """name: four
resources: {nodes: 4, tasks_per_node: 1, time: '00:05:00'}
train:
  backend: torch
  model: mlp
  data: {samples: 512, shape: [16], classes: 4}
  batch_size: 32
  max_steps: 12
"""


def test_a_four_node_cluster_on_a_fabric_runs_a_four_rank_job_and_goes_down_clean(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the local cluster and its fabric run as root")
    root = tmp_path / "cluster"
    env = {k: v for k, v in os.environ.items()
           if k not in ("HPCSUITE_PROFILE", "SLURM_CONF")}
    env.update(HPCSUITE_CLUSTER_DIR=str(root), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    port = str(TEST_PORT + 80)
    up = run_cli("cluster", "up", "--nodes", "4", "--fabric", "1gbit", "--port", port,
                 env=env, timeout=240)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "nodes: node1=idle, node2=idle, node3=idle, node4=idle" in up.stdout, up.stdout
        for line in run_cli("cluster", "env", env=env, check=True).stdout.splitlines():
            name, value = line.removeprefix("export ").split("=", 1)
            env[name] = shlex.split(value)[0]
        # a running cluster keeps its nodes, and says how to change them
        again = run_cli("cluster", "up", "--nodes", "2", "--port", port, env=env, check=True)
        assert "it runs with 4 nodes, not 2: `hpcsuite cluster down` and up again" in \
            again.stdout, again.stdout
        status = json.loads(run_cli("cluster", "status", "--json", env=env, check=True).stdout)
        assert status["up"] and set(status["nodes"]) == {f"node{i}" for i in range(1, 5)}
        links = status["fabric"]["links"]
        assert len({link["addr"] for link in links.values()}) == 4 and \
            all(link["up"] for link in links.values()), links

        (tmp_path / "four.yaml").write_text(SPEC)
        done = run_cli("submit", "four.yaml", "--wait", "--json", cwd=tmp_path, env=env,
                       timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        job = json.loads(done.stdout)
        results = json.loads((Path(job["run_dir"]) / "results.json").read_text())
        assert results["status"] == "completed" and results["world_size"] == 4, results
        assert results["final_step"] == 12
        nodelist = subprocess.run(["sacct", "-j", str(job["job_id"]), "-X", "-n", "-P", "-o",
                                   "NodeList"], env=env, capture_output=True, text=True,
                                  timeout=60).stdout.split()
        assert nodelist == ["node[1-4]"], nodelist
        # the last node's link, as for node2 on the 2-node fabric
        run_cli("cluster", "link", "node4", "down", env=env, check=True)
        down = json.loads(run_cli("cluster", "status", "--json", env=env, check=True).stdout)
        assert not down["fabric"]["links"]["node4"]["up"] and down["fabric"]["links"]["node3"]["up"]
        run_cli("cluster", "link", "node4", "up", env=env, check=True)
    finally:
        stopped = run_cli("cluster", "down", env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped slurmd-node4" in stopped.stdout and "removed the nodes' network" in \
        stopped.stdout, stopped.stdout
    assert not any(Path(f"/run/netns/hpcsuite-{port}-node{i}").exists() for i in range(1, 5))
    left = subprocess.run(["pgrep", "-f", f"slurmd -D -N node[0-9]+ -f {root}"],
                          capture_output=True, text=True).stdout.split()
    assert not left, f"slurmd left running: {left}"
