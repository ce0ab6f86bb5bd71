"""End to end at 16 nodes (issue 53, points 4 and 5): a local cluster of 16 nodes, each in a
network namespace of its own on the shaped bridge, and a 16-rank script-mode job.

- Every rank stalls 60 s mid-training (a long checkpoint save), and rank 0 works 60 s after its
  last step and ``run.finish()`` (the other ranks gone): the job completes with no verdict of
  any watch; each node's network watch asked its two neighbours a few times and said once that
  the stall was no network fault.
- A node whose link is cut mid-training is named within 60 s, by its neighbours in the ring
  (unreachable from node8 or node10) or by itself.

In test-full (tests/tiers.py): sixteen torch ranks on this 2-core machine take minutes. CI keeps
both at 2 nodes: tests/test_e2e_script_stragglers.py (rank 0 working 60 s after its last step)
and tests/test_e2e_fabric.py (a cut link named in seconds); bench/scale.py runs the stall at
up to 32 ranks."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TEST_PORT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NODES = 16

SCRIPT = """import argparse
import os
import time

import horovod.torch as hvd
import torch

from hpcsuite import api

parser = argparse.ArgumentParser()
parser.add_argument("--stall-at", type=int, default=0)
parser.add_argument("--stall", type=float, default=0.0)
parser.add_argument("--export", type=float, default=0.0)
args = parser.parse_args()
hvd.init()
torch.set_num_threads(1)
run = api.Run(hvd)
model = torch.nn.Linear(8, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
for batch in run.batches(1000000):
    time.sleep(0.05)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    run.log(loss=float(loss))
    if run.step == args.stall_at:
        time.sleep(args.stall)           # every rank: a long checkpoint save
    if run.should_stop():
        break
run.finish(params=api.torch_state(model)["model"])
if hvd.rank() == 0 and args.export:      # work after the last step, the other ranks gone
    time.sleep(args.export)
    with open(os.path.join(os.environ["HPCSUITE_RUN_DIR"], "exported.txt"), "w") as f:
        f.write("the model\\n")
"""

SPEC = """name: {name}
resources: {{nodes: {nodes}, tasks_per_node: 1, time: "00:12:00"}}
train: {{backend: torch, script: scale.py, args: {args}, batch_size: 4, epochs: 1,
         max_steps: {steps}, preemption: {{max_failures: 0}}}}
"""


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory):
    from hpcsuite.site.cluster import LocalCluster

    if os.geteuid() != 0:
        pytest.skip("--fabric makes network namespaces: root only")
    root = tmp_path_factory.mktemp("sixteen-nodes")
    cluster = LocalCluster(root, port=TEST_PORT + 100, nodes=NODES, fabric="1gbit")
    try:
        cluster.up(timeout=60 + 3 * NODES)
        env = {k: v for k, v in os.environ.items() if k != "HPCSUITE_PROFILE"}
        env.update(cluster.client_env(), HPCSUITE_CLUSTER_DIR=str(root),
                   XDG_CONFIG_HOME=str(root / "xdg"))
        yield cluster, env
    finally:
        cluster.down()


def submit(tmp_path, env, name, args, steps, wait=True):
    (tmp_path / "scale.py").write_text(SCRIPT)
    (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, nodes=NODES, steps=steps,
                                                       args=json.dumps(args)))
    argv = ["submit", f"{name}.yaml", "--json"] + (["--wait"] if wait else [])
    out = run_cli(*argv, cwd=tmp_path, env=env, timeout=780)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_sixteen_ranks_stall_60_s_and_rank_0_works_60_s_after_its_last_step(sixteen, tmp_path):
    cluster, env = sixteen
    payload = submit(tmp_path, env, "long-save",
                     ["--stall-at", "20", "--stall", "60", "--export", "60"], steps=40)
    run_dir = Path(payload["run_dir"])
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["world_size"] == NODES, results
    assert (run_dir / "exported.txt").read_text() == "the model\n"
    assert not list(run_dir.glob("FAILED-attempt-*")), "a watch gave a verdict"
    logs = {r: (run_dir / "logs" / f"rank-{r}.log").read_text() for r in range(NODES)}
    for rank, log in logs.items():
        assert "training is over: the startup and network watches stop" in log, (rank, log)
        said = log.count("not a network fault")
        assert said == 1, (rank, said, log)    # each node's watch (one rank a node) said it once
    assert "the neighbours answer (node2, node16)" in logs[0], logs[0]


def test_a_node_cut_off_at_16_nodes_is_named_within_60_s(sixteen, tmp_path):
    from hpcsuite.runs.rundir import RunDir

    cluster, env = sixteen
    payload = submit(tmp_path, env, "cut", [], steps=1000000, wait=False)
    job_id = str(payload["job_id"])
    run_dir = RunDir(tmp_path / "runs" / "cut" / job_id)
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        if run_dir.progress.is_file() and \
                json.loads(run_dir.progress.read_text()).get("step", 0) >= 100:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the 16-rank job did not reach step 100")
    marker = run_dir.failed(0)
    try:
        run_cli("cluster", "link", "node9", "down", env=env, check=True)
        cut_at = time.monotonic()
        while not marker.is_file() and time.monotonic() - cut_at < 120:
            time.sleep(0.5)
        took = time.monotonic() - cut_at
    finally:
        run_cli("cluster", "link", "node9", "up", env=env, check=True)
        subprocess.run(["scancel", job_id], env=env, timeout=60)
    assert took < 60, f"no verdict {took:.0f} s after node9's link went down"
    text = marker.read_text()
    assert "network: node9 unreachable from node8" in text or \
        "network: node9 unreachable from node10" in text or \
        "node9 itself lost its network (it reaches none of its 2 peer(s)" in text, text
    assert "are gone" not in text, text
