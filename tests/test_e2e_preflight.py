"""End to end on the local Slurm cluster (issue O, point 2): a job whose spec asks for the fabric
preflight measures node1-node2's allreduce before training. A bar the link reaches: the job
trains, preflight.json holds the pair's figures. A bar no link reaches (10000 GB/s): the job
ends with exit 2 before training, naming the pair, recorded and not requeued, and `status`
says why."""

import json

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SPEC = """name: {name}
launcher: {launcher}
resources: {{nodes: 2, tasks_per_node: 1, time: "00:05:00"}}
preflight: {{fabric: {{min_busbw_gbps: {bar}, size_mb: 4}}}}
train:
  data: {{samples: 512, shape: [16], classes: 4}}
  batch_size: 16
  max_steps: 10
  preemption: {{max_failures: 2}}
"""


def submit(tmp_path, env, name, bar, launcher="mpirun"):
    (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, bar=bar, launcher=launcher))
    return run_cli("submit", f"{name}.yaml", "--wait", "--json", cwd=tmp_path, env=env,
                   timeout=600)


def test_a_bar_the_link_reaches_lets_the_job_train(local_cluster, tmp_path):
    _, env = local_cluster
    out = submit(tmp_path, env, "reached", 0.001)
    assert out.returncode == 0, out.stdout + out.stderr
    payload = json.loads(out.stdout)
    run_dir = tmp_path / "runs" / "reached" / payload["job_id"]
    record = json.loads((run_dir / "preflight.json").read_text())
    assert record["passed"] and record["hosts"] == ["node1", "node2"]
    (pair,) = record["fabric"]["pairs"]
    assert pair["nodes"] == ["node1", "node2"] and pair["busbw_Bps"] > 1e6
    assert pair["busbw_Bps"] == pytest.approx((4 << 20) / pair["seconds"], rel=1e-12)
    assert record["fabric"]["required_busbw_Bps"] == pytest.approx(1e6)
    assert payload["results"]["final_step"] == 10
    log = (tmp_path / "runs" / "reached" / f"slurm-{payload['job_id']}.out").read_text()
    assert "hpcsuite preflight: passed (1 node pair(s), lowest busbw" in log


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_a_bar_no_link_reaches_ends_the_job_with_exit_2_before_training(local_cluster, tmp_path,
                                                                          launcher):
    _, env = local_cluster
    name = f"unreachable-{launcher}"
    out = submit(tmp_path, env, name, 10000, launcher)
    root = tmp_path / "runs" / name
    log_path = next(root.glob("slurm-*.out"))
    log = log_path.read_text()
    assert out.returncode != 0, out.stdout + out.stderr + log
    job_id = log_path.name[len("slurm-"):-len(".out")]
    run_dir = root / job_id
    line = ("preflight.fabric: 1 of 1 node pair(s) below the 10000 GB/s busbw required: "
            "node1-node2 ")
    assert f"hpcsuite preflight: {line}" in log, log
    assert "not requeued, it would fail the same way" in log, log
    record = json.loads((run_dir / "preflight.json").read_text())
    assert not record["passed"] and record["fabric"]["slow_pairs"] == [["node1", "node2"]]
    assert record["fabric"]["pairs"][0]["busbw_Bps"] < 1e13
    assert not (run_dir / "results.json").exists() and not (run_dir / "logs").exists()
    (attempt,) = [json.loads(l) for l in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert (attempt["outcome"], attempt["exit"], attempt["requeued"]) == ("failed", 2, False)
    status = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert line in status and "FAILED" in status, status
    # `submit --wait` leads with it: the failed preflight, exit 2 (the headline test of
    # test_e2e_script_words ran the same job; it is in make test-full)
    assert out.returncode == 2, out.stdout + out.stderr
    headline = next(l for l in out.stderr.splitlines() if l.startswith("error: "))
    assert headline.startswith(f"error: job {job_id} ended FAILED: {line}"), headline
