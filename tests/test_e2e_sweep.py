"""A sweep end to end on the local Slurm cluster: a 4-element grid over train.lr x train.seed
submitted as ONE job array (2 at a time), one element cancelled while it waits, the others
completing with their own job.json; `sweep run --wait` says which did not complete; the
cancelled one resubmitted alone completes; the report ranks every element and marks the best;
`runs` lists both arrays and their elements, and `status` takes an element's id."""

import json
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

JOB = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  model: mlp
  data: {kind: synthetic, samples: 512, shape: [16], classes: 4}
  eval: {split: 0.25}
  batch_size: 32
  epochs: 2
"""
SWEEP = """name: lrseed
base: job.yaml
axes:
  train.lr: [0.01, 0.2]
  train.seed: [1, 2]
max_parallel: 2
metric: {name: val_accuracy, goal: max}
"""


def test_a_sweep_runs_as_one_array_and_a_cancelled_element_runs_again(local_cluster, tmp_path):
    _, env = local_cluster
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    sweep_dir = tmp_path / "sweeps" / "lrseed"
    follow = subprocess.Popen([sys.executable, "-m", "hpcsuite", "sweep", "run", "sweep.yaml",
                               "--wait", "--json"], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (sweep_dir / "submissions.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    array = json.loads((sweep_dir / "submissions.jsonl").read_text())["array_job_id"]
    # %2: elements 2 and 3 wait while 0 and 1 run; cancel 3 before it starts
    run_cli("cancel", f"{array}_3", cwd=tmp_path, env=env, check=True)
    out, err = follow.communicate(timeout=600)
    assert follow.returncode == 1, out + err
    assert "element(s) 3 did not complete" in err and "sweep resubmit" in err
    rows = {r["index"]: r for r in json.loads(out)["elements"]}
    assert [rows[i]["done"] for i in range(4)] == [True, True, True, False]
    # Slurm keeps no record of an element cancelled before it started
    assert rows[3]["state"] == "NEVER RAN"

    # one script, one sbatch: the header says so, and each element ran its own job.json
    script = (sweep_dir / "scripts" / f"{array}.sbatch").read_text()
    assert "#SBATCH --array=0-3%2\n" in script
    values = [(0.01, 1), (0.01, 2), (0.2, 1), (0.2, 2)]
    for i, (lr, seed) in enumerate(values[:3]):
        run_dir = tmp_path / "runs" / "lrseed" / f"{array}_{i}"
        job = json.loads((run_dir / "job.json").read_text())
        assert (job["train"]["lr"], job["train"]["seed"], job["name"]) == (lr, seed, "lrseed")
        assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"
        assert (tmp_path / "runs" / "lrseed" / f"slurm-{array}_{i}.out").is_file()

    status = run_cli("status", f"{array}_2", "--json", cwd=tmp_path, env=env, check=True)
    assert json.loads(status.stdout)["run_dir"].endswith(f"runs/lrseed/{array}_2")

    # the cancelled element again, alone, into the same layout
    again = run_cli("sweep", "resubmit", str(sweep_dir), "--element", "3", "--wait", cwd=tmp_path,
                    env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    resubmits = [json.loads(l) for l in (sweep_dir / "submissions.jsonl").read_text().splitlines()]
    assert len(resubmits) == 2 and resubmits[1]["indices"] == [3]
    second = resubmits[1]["array_job_id"]
    assert "#SBATCH --array=3\n" in (sweep_dir / "scripts" / f"{second}.sbatch").read_text()
    job = json.loads((tmp_path / "runs" / "lrseed" / f"{second}_3" / "job.json").read_text())
    assert (job["train"]["lr"], job["train"]["seed"]) == values[3]
    refused = run_cli("sweep", "resubmit", str(sweep_dir), "--element", "3", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and f"element 3 completed as job {second}_3" in refused.stderr

    # the report: every element, the best by the metric marked, and its files
    proc = run_cli("sweep", "report", str(sweep_dir), "--json", cwd=tmp_path, env=env, check=True)
    report = json.loads(proc.stdout)
    accuracy = {r["index"]: r["val_accuracy"] for r in report["rows"]}
    assert all(0 <= a <= 1 for a in accuracy.values()) and len(accuracy) == 4
    assert report["best"] == max(accuracy, key=accuracy.get)
    assert [r["best"] for r in report["rows"]].count(True) == 1
    assert all(r["state"] == "COMPLETED" and r["samples_per_s"] > 0 and r["final_loss"] > 0
               for r in report["rows"])
    folder = sweep_dir / "report"
    assert (folder / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((folder / "sweep.csv").read_text().splitlines()) == 5
    text = run_cli("sweep", "report", str(sweep_dir), cwd=tmp_path, env=env, check=True).stdout
    assert f"* best by val_accuracy (max): element {report['best']}" in text

    # runs: both arrays, each followed by its elements, their states from one Slurm query
    runs = json.loads(run_cli("runs", "--json", cwd=tmp_path, env=env, check=True).stdout)
    ids = [r["job_id"] for r in runs]
    assert ids == [array, *(f"{array}_{i}" for i in range(4)), second, f"{second}_3"]
    assert runs[0]["array"]["sweep"] == "lrseed" and runs[0]["state"] == "ARRAY"
    assert [r["state"] for r in runs[1:5]] == ["COMPLETED"] * 3 + ["NEVER RAN"]
    assert runs[6]["state"] == "COMPLETED"
    table = run_cli("runs", cwd=tmp_path, env=env, check=True).stdout
    assert "lrseed [4]" in table and f"{array}_3" in table
    status = run_cli("sweep", "status", str(sweep_dir), cwd=tmp_path, env=env, check=True).stdout
    assert "4/4 done" in status and f"{second}_3" in status
