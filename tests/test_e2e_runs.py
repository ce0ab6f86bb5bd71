"""End to end: the run registry, runs/status/logs/cancel by name, through the real local cluster."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

HELD = "name: held\nresources: {nodes: 1, time: '00:02:00'}\ntrain: {max_steps: 1}\n"


def test_fifty_submits_at_once_are_all_recorded_and_listed(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "held.yaml").write_text(HELD)

    def submit(_):
        return subprocess.run([sys.executable, "-m", "hpcsuite", "submit", "held.yaml", "--hold"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(50) as pool:
        done = list(pool.map(submit, range(50)))
    ids = [p.stdout.strip() for p in done]
    try:
        assert all(p.returncode == 0 for p in done), [p.stderr for p in done if p.returncode]
        assert len(set(ids)) == 50
        lines = (tmp_path / ".hpcsuite" / "runs.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert sorted(r["job_id"] for r in records) == sorted(ids)
        for r in records[:3]:
            assert r["spec"] == str(tmp_path / "held.yaml") and r["name"] == "held"
            assert (tmp_path / r["run_dir"] / "job.sbatch").is_file()
            assert json.loads((tmp_path / r["run_dir"] / "profile.json").read_text())["mpi"]
        listed = json.loads(run_cli("runs", "--json", "-n", "0", cwd=tmp_path, env=env,
                                    check=True).stdout)
        assert [r["job_id"] for r in listed] == [r["job_id"] for r in records]
        assert {r["state"] for r in listed} == {"PENDING"}
        # A name means its latest run; cancel by name.
        latest = records[-1]["job_id"]
        status = json.loads(run_cli("status", "held", "--json", cwd=tmp_path, env=env,
                                    check=True).stdout)
        assert status["job_id"] == latest and status["reason"] == "JobHeldUser"
        out = run_cli("cancel", "held", cwd=tmp_path, env=env, check=True)
        assert out.stdout.strip() == f"cancelled {latest}"
    finally:
        subprocess.run(["scancel", *[i for i in ids if i.isdigit()]], env=env, timeout=60)


def test_follow_a_job_by_name_then_its_status_and_rank_logs(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "follow.yaml").write_text(
        "name: follow\nresources: {nodes: 2, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 1000, max_steps: 1500}\n")
    job_id = run_cli("submit", "follow.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    followed = run_cli("logs", "follow", "-f", cwd=tmp_path, env=env, timeout=600)
    assert followed.returncode == 0, followed.stderr
    assert "hpcsuite train: completed at step 1500" in followed.stdout
    status = json.loads(run_cli("status", "follow", "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    assert status["job_id"] == job_id and status["state"] == "COMPLETED"
    assert status["progress"]["step"] > 0 and status["progress"]["samples_per_s"] > 0
    assert status["results"]["final_step"] == 1500
    text = run_cli("status", "follow", cwd=tmp_path, env=env, check=True).stdout
    assert text.startswith(f"job {job_id} (follow): COMPLETED") and "results: completed" in text
    rank1 = run_cli("logs", "follow", "--rank", "1", cwd=tmp_path, env=env, check=True).stdout
    assert "rank 1 " in rank1 and "rank 0 " not in rank1
    listed = run_cli("runs", cwd=tmp_path, env=env, check=True).stdout
    assert job_id in listed and "COMPLETED" in listed
    unknown = run_cli("status", "nosuchrun", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and "runs.jsonl" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_submit_wait_shows_progress_and_exits_with_the_outcome(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "w.yaml").write_text(
        "name: w\nresources: {nodes: 1, time: '00:05:00'}\n"
        "train: {data: {samples: 4096, shape: [32]}, batch_size: 32, epochs: 1000, max_steps: 3000}\n")
    proc = run_cli("submit", "w.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    states = [line for line in proc.stderr.splitlines() if "] job " in line]
    assert any(": RUNNING" in line for line in states), proc.stderr
    assert "completed at step 3000" in proc.stdout
