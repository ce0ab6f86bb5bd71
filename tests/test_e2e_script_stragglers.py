"""End to end, script mode (issue 42, point 8): a 2-node job running the user's own Horovod
script, whose rank 1 works twice as long each step (a sleep), names rank 1 on node2 in
status --json, status, report, results.json's rank_balance and the Prometheus textfile; the
same script balanced names nobody. The script times its DistributedOptimizer's allreduce with
run.time_allreduce(); tests/test_e2e_stragglers.py is the managed loop's version,
tests/test_script_balance.py the feeding on threads."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCRIPT = """import argparse
import os
import time

import horovod.torch as hvd
import torch

from hpcsuite import api

parser = argparse.ArgumentParser()
parser.add_argument("--extra", type=float, default=0.0)
parser.add_argument("--export", type=float, default=0.0)
args = parser.parse_args()
hvd.init()
torch.set_num_threads(1)
run = api.Run(hvd)
model = torch.nn.Linear(8, 2)
optimizer = run.time_allreduce(hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()))
x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
extra = args.extra if hvd.rank() == 1 else 0.0
for batch in run.batches(100000):
    time.sleep(0.005 + extra)                  # the step's work; rank 1's twice as long
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    run.log(loss=float(loss))
    if run.should_stop():
        break
run.finish(params=api.torch_state(model)["model"])
if hvd.rank() == 0 and args.export:   # work after the last step, the other rank gone (issue 51)
    time.sleep(args.export)
    with open(os.path.join(os.environ["HPCSUITE_RUN_DIR"], "exported.txt"), "w") as f:
        f.write("the model\\n")
"""

# ~25 votes of ~0.25 s over 600 steps: the rule's window (200 steps, 20 votes) and a few more.
SPEC = """name: {name}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:05:00"}}
train: {{backend: torch, script: slowed.py, args: [--extra, "{extra}", --export, "{export}"], batch_size: 4,
         epochs: 1, max_steps: 600,
         monitor: {{enabled: true, interval_seconds: 0.2, prometheus_dir: prom}}}}
"""


def submit(tmp_path, env, name, extra, export=0):
    (tmp_path / "slowed.py").write_text(SCRIPT)
    (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, extra=extra, export=export))
    out = run_cli("submit", f"{name}.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    payload = json.loads(out.stdout)
    assert payload["results"]["mode"] == "script", payload["results"]
    return payload


def test_a_script_whose_rank_1_works_twice_as_long_names_it(local_cluster, tmp_path):
    cluster, env = local_cluster
    payload = submit(tmp_path, env, "script-slow", 0.005)
    balance = payload["results"]["rank_balance"]
    slow = balance["slow_rank"]
    assert (slow["rank"], slow["host"]) == (1, "node2"), balance
    assert slow["ratio"] >= 1.5 and slow["steps"] >= 200 and slow["others_wait"] > 0.2, slow
    own, wait = balance["own_s"], balance["wait_s"]
    assert own[1] > 0.009 and 0.004 < own[0] < 0.008 and wait[0] > 0.003 > wait[1], balance
    status = json.loads(run_cli("status", "script-slow", "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    status = status[0] if isinstance(status, list) else status
    assert status["results"]["slow_rank"]["rank"] == 1, status
    assert status["progress"]["slow_rank"]["rank"] == 1, status["progress"]
    text = run_cli("status", "script-slow", cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank: rank 1 on node2: its own work" in text, text
    report = run_cli("report", "script-slow", cwd=tmp_path, env=env, check=True).stdout
    assert "slow rank: rank 1 on node2" in report and "own work / wait per step" in report, report
    text = next((tmp_path / "prom").glob(f"hpcsuite-*-*-{payload['job_id']}-rank-0.prom")).read_text()
    families = {f.name: f.samples[0].value for f in text_string_to_metric_families(text)}
    assert families["hpcsuite_slow_rank"] == 1 and families["hpcsuite_step_wait_seconds"] > 0


def test_the_same_script_balanced_names_nobody(local_cluster, tmp_path):
    """Its rank 0 also works 60 s after its last step and run.finish(), when rank 1 has
    exited: three times the network watch's stall (20 s). Training is over, so the watch has
    stopped (issue 53, point 4; before issue 51 node2's refusals failed the job); the job
    completes, and what rank 0 wrote is there."""
    cluster, env = local_cluster
    payload = submit(tmp_path, env, "script-even", 0.0, export=60)
    run_dir = next(p.parent for p in (tmp_path / "runs" / "script-even").glob("*/results.json"))
    assert (run_dir / "exported.txt").read_text() == "the model\n"
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "training is over: the startup and network watches stop" in log, log
    assert "no training step for" not in log, log        # no probe after the last step
    balance = payload["results"]["rank_balance"]
    assert balance["slow_rank"] is None, balance
    assert all(t is not None and t > 0 for t in balance["own_s"] + balance["wait_s"]), balance
    status = json.loads(run_cli("status", "script-even", "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    status = status[0] if isinstance(status, list) else status
    assert status["results"]["slow_rank"] is None and "slow rank" not in run_cli(
        "status", "script-even", cwd=tmp_path, env=env, check=True).stdout
