"""End to end on the local Slurm cluster: train.tracking's MLflow runs, read back with MLflow's
own MlflowClient. A 2-rank managed job (params, tags with the Slurm job id and the git commit,
the loss results.json records, results.json and the report's plots as artifacts); a script
job preempted and requeued (ONE MLflow run whose loss history spans both attempts); a
sweep's elements (one experiment, tagged with the sweep and their array index)."""

import json
import shutil
import subprocess

import pytest

from conftest import follow_job, preempt_after_step, run_cli
from test_whole_run import STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
mlflow = pytest.importorskip("mlflow")


def mlflow_run(run_dir):
    """(client, run) of the run directory's MLflow run, through MLflow's own client."""
    from hpcsuite.runtime.tracking import client_for     # MlflowClient, file stores allowed

    record = json.loads((run_dir / "mlflow.json").read_text())
    client = client_for(record["uri"])
    return client, client.get_run(record["run_id"])


def git_repo(work) -> str | None:
    """Make ``work`` a git work tree with one commit; its hash (None without git)."""
    if shutil.which("git") is None:
        return None
    git = ["git", "-C", str(work), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


MANAGED = """name: trk
resources: {nodes: 2, time: "00:05:00"}
train:
  model: mlp
  data: {samples: 1024, shape: [16], classes: 4}
  batch_size: 16
  epochs: 3
  lr: 0.125
  eval: {split: 0.25}
  monitor: {enabled: true, interval_seconds: 0.2}
  tracking: {mlflow: {}}
"""


def test_a_managed_job_logs_its_spec_tags_loss_and_results(local_cluster, tmp_path):
    _, env = local_cluster
    commit = git_repo(tmp_path)
    (tmp_path / "trk.yaml").write_text(MANAGED)
    out = run_cli("submit", "trk.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    payload = json.loads(out.stdout)
    r, run_dir = payload["results"], tmp_path / payload["run_dir"]
    client, run = mlflow_run(run_dir)
    assert json.loads((run_dir / "mlflow.json").read_text())["uri"] == \
        (tmp_path / "runs" / "trk" / "mlruns").as_uri()          # the default store
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "trk"
    params, tags = run.data.params, run.data.tags
    assert params["train.lr"] == "0.125" and params["resources.nodes"] == "2"
    assert params["train.tracking.mlflow.experiment"] == "null"
    assert tags["hpcsuite.slurm_job_id"] == str(payload["job_id"])
    assert tags["hpcsuite.attempt"] == "0" and tags["hpcsuite.status"] == "completed"
    if commit:
        assert tags["mlflow.source.git.commit"] == commit
    loss = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")]
    assert loss and loss[-1][0] == r["final_step"]
    for step, value in loss:        # the global mean over both ranks, results.json's number
        assert value == pytest.approx(r["loss"][step - 1], rel=1e-5), step
    for key in ("learning_rate", "throughput/samples_per_s", "validation/loss",
                "utilisation/rank0/cpu_percent", "utilisation/rank1/cpu_percent"):
        assert client.get_metric_history(run.info.run_id, key), key
    evals = client.get_metric_history(run.info.run_id, "validation/loss")
    assert [(m.step, m.value) for m in evals] == [(e["step"], e["loss"]) for e in r["eval"]]
    assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["results.json"]
    logged = client.download_artifacts(run.info.run_id, "results.json", str(tmp_path))
    assert json.loads(open(logged).read())["final_step"] == r["final_step"]
    # only rank 0 logged: one run in the experiment
    assert len(client.search_runs([run.info.experiment_id])) == 1

    report = run_cli("report", "trk", cwd=tmp_path, env=env, check=True).stdout
    assert f"plots added to run {run.info.run_id}" in report, report
    plots = {f.path for f in client.list_artifacts(run.info.run_id, "report")}
    assert "report/loss.png" in plots, plots


# The preempted script job of tests/test_whole_run.py, tracked (one rank: the script uses no
# Horovod, so each rank would be a world of its own).
SCRIPT = """name: trs
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  script: steps.py
  batch_size: 8
  epochs: 30
  checkpoint: {every_steps: 100000}
  preemption: {signal: USR1, requeue: true}
  tracking: {mlflow: {experiment: preempted}}
"""


def test_a_preempted_and_requeued_job_continues_one_mlflow_run(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "steps.py").write_text(STEPS)
    (tmp_path / "trs.yaml").write_text(SCRIPT)
    job_id = run_cli("submit", "trs.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    run_dir = tmp_path / "runs" / "trs" / job_id
    preempt_after_step(env, job_id, run_dir)
    state = follow_job(env, job_id, tmp_path, cluster)
    log = (tmp_path / "runs" / "trs" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    assert "hpcsuite script: preempted at step" in log

    r = json.loads((run_dir / "results.json").read_text())
    total, cut = r["final_step"], r["start_step"]     # cut: where attempt 0 saved and stopped
    assert (r["attempt"], r["status"]) == (1, "completed") and 5 <= cut < total
    client, run = mlflow_run(run_dir)
    assert len(client.search_runs([run.info.experiment_id])) == 1       # ONE MLflow run
    assert client.get_experiment(run.info.experiment_id).name == "preempted"
    assert run.info.status == "FINISHED"
    assert run.data.tags["hpcsuite.attempt"] == "1" and run.data.tags["hpcsuite.slurm_job_id"] == job_id
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    steps = [s for s, _ in loss]
    assert steps[0] == 1 and steps[-1] == total
    assert any(s <= cut for s in steps) and any(s > cut for s in steps)   # both attempts'
    assert all(v == pytest.approx(10.0 / s, rel=1e-5) for s, v in loss)
    assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["results.json"]


JOB = """name: base
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  model: mlp
  data: {kind: synthetic, samples: 256, shape: [16], classes: 4}
  batch_size: 32
  epochs: 2
  tracking: {mlflow: {}}
"""
SWEEP = """name: lrs
base: job.yaml
axes:
  train.lr: [0.01, 0.2]
max_parallel: 2
"""


def test_a_sweeps_elements_are_grouped(local_cluster, tmp_path):
    _, env = local_cluster
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    out = run_cli("sweep", "run", "sweep.yaml", "--wait", "--json", cwd=tmp_path, env=env,
                  timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    array = json.loads((tmp_path / "sweeps" / "lrs" / "submissions.jsonl").read_text()
                       .splitlines()[0])["array_job_id"]
    runs = {}
    for index in (0, 1):
        client, run = mlflow_run(tmp_path / "runs" / "lrs" / f"{array}_{index}")
        runs[index] = run
        assert run.info.status == "FINISHED"
        assert run.data.tags["hpcsuite.sweep"] == "lrs"
        assert run.data.tags["hpcsuite.array_job_id"] == str(array)
        assert run.data.tags["hpcsuite.array_index"] == str(index)
        assert run.info.run_name == f"lrs-{array}_{index}"
    assert {r.data.params["train.lr"] for r in runs.values()} == {"0.01", "0.2"}
    assert runs[0].info.experiment_id == runs[1].info.experiment_id     # one experiment
    assert client.get_experiment(runs[0].info.experiment_id).name == "lrs"
    siblings = client.search_runs([runs[0].info.experiment_id],
                                  "tags.`hpcsuite.sweep` = 'lrs'")
    assert {r.info.run_id for r in siblings} == {r.info.run_id for r in runs.values()}
