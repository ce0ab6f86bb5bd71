"""End to end: a 2-node job whose rank 1 is slower all along (the user's model sleeps 3 ms a
forward there) names rank 1 on node2 in results.json, status, report and the Prometheus
textfile; the same job balanced names nobody (issue O, point 1)."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NET = """
import os
import time

from torch import nn


class Slow(nn.Module):
    def __init__(self, shape, classes, delay):
        super().__init__()
        self.layer = nn.Linear(shape[0], classes)
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))
        self.delay = delay if rank == "1" else 0.0

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.layer(x)


def build(shape, classes, delay=0.0):
    return Slow(shape, classes, delay)
"""

SPEC = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:05:00"}}
train:
  model: net.py:build
  model_args: {{delay: {delay}}}
  data: {{samples: 4096, shape: [32], classes: 4}}
  batch_size: 16
  epochs: 1000
  max_steps: 1500
  monitor: {{enabled: true, interval_seconds: 0.2, prometheus_dir: prom}}
"""


def submit(tmp_path, env, name, delay):
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, delay=delay))
    out = run_cli("submit", f"{name}.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_a_rank_slower_all_along_is_named_where_the_user_looks(local_cluster, tmp_path):
    cluster, env = local_cluster
    payload = submit(tmp_path, env, "slow", 0.003)
    balance = payload["results"]["rank_balance"]
    slow = balance["slow_rank"]
    assert (slow["rank"], slow["host"]) == (1, "node2"), balance
    assert slow["ratio"] >= 2.0 and slow["steps"] >= 200
    assert slow["others_wait"] > 0.3 and slow["cost"] > 0.3
    own, wait = balance["own_s"], balance["wait_s"]
    assert own[1] > 0.003 > own[0] and wait[0] > 0.002 and wait[1] is not None
    status = run_cli("status", "slow", cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank: rank 1 on node2: its own work" in status, status
    assert "the other ranks wait" in status
    report = run_cli("report", "slow", cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank: rank 1 on node2" in report and "per rank, own work / wait per step" in report
    progress = json.loads((tmp_path / "runs" / "slow" / payload["job_id"] / "progress.json")
                          .read_text())
    assert progress["slow_rank"]["rank"] == 1
    text = next((tmp_path / "prom").glob(f"hpcsuite-*-*-{payload['job_id']}-rank-0.prom")).read_text()
    families = {f.name: f.samples[0].value for f in text_string_to_metric_families(text)}
    assert families["hpcsuite_slow_rank"] == 1 and families["hpcsuite_step_wait_seconds"] > 0


def test_the_same_job_balanced_names_nobody(local_cluster, tmp_path):
    cluster, env = local_cluster
    payload = submit(tmp_path, env, "even", 0.0)
    balance = payload["results"]["rank_balance"]
    assert balance["slow_rank"] is None, balance
    assert all(t is not None and t > 0 for t in balance["own_s"] + balance["wait_s"])
    status = run_cli("status", "even", cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank" not in status
    assert "slow rank" not in run_cli("report", "even", cwd=tmp_path, env=env, check=True).stdout
