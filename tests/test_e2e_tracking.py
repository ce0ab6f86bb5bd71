"""End to end on the local Slurm cluster: train.tracking's MLflow runs, read back with MLflow's
own MlflowClient. A 2-rank managed job (params, tags with the Slurm job id and the git commit
recorded at submit, the loss results.json records, results.json and the report's plots as
artifacts; `status` names the run; `tracking sync` into a real `mlflow server` and into a
SQLite database, a second sync adding nothing); a script job preempted and requeued (ONE MLflow
run whose loss history spans both attempts); a sweep's elements (one experiment, tagged with
the sweep and their array index); a script that raises (its run ends FAILED, `attempt end`
says why); tracking that fell back or was lost, said by `status` and `submit --wait`."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import follow_job, run_cli
from shared_observe import STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
mlflow = pytest.importorskip("mlflow")


def mlflow_run(run_dir):
    """(client, run) of the run directory's MLflow run, through MLflow's own client."""
    from hpcsuite.runs.mlflow_store import client_for     # MlflowClient, file stores allowed

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


def git(work, *args) -> str:
    return subprocess.run(["git", "-C", str(work), "-c", "user.email=t@example.org", "-c",
                           "user.name=t", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_managed_job_logs_its_spec_tags_loss_and_results(local_cluster, tmp_path):
    cluster, env = local_cluster
    commit = git_repo(tmp_path)
    (tmp_path / "trk.yaml").write_text(MANAGED)        # untracked: the tree is dirty
    job_id = run_cli("submit", "trk.yaml", "--hold", cwd=tmp_path, env=env,
                     check=True).stdout.strip()
    if commit:      # the branch moves on while the job waits: the run names the commit submitted
        git(tmp_path, "commit", "-q", "--allow-empty", "-m", "later")
    subprocess.run(["scontrol", "release", job_id], env=env, check=True, timeout=30)
    state = follow_job(env, job_id, tmp_path, cluster)
    run_dir = tmp_path / "runs" / "trk" / job_id
    assert state["state"] == "COMPLETED", (run_dir.parent / f"slurm-{job_id}.out").read_text()
    payload = {"job_id": job_id, "tracking": state["tracking"]}
    r = json.loads((run_dir / "results.json").read_text())
    client, run = mlflow_run(run_dir)
    assert state["tracking"]["run_id"] == run.info.run_id and state["tracking"]["state"] == "ended"
    shown = run_cli("status", job_id, cwd=tmp_path, env=env, check=True).stdout
    assert f"MLflow: run {run.info.run_id} (FINISHED), experiment 'trk', at " \
           f"{(tmp_path / 'runs' / 'trk' / 'mlruns').as_uri()}" in shown, shown
    assert json.loads((run_dir / "mlflow.json").read_text())["uri"] == \
        (tmp_path / "runs" / "trk" / "mlruns").as_uri()          # the default store
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "trk"
    params, tags = run.data.params, run.data.tags
    assert params["train.lr"] == "0.125" and params["resources.nodes"] == "2"
    assert params["train.tracking.mlflow.experiment"] == "trk"         # resolved, not null
    assert params["train.tracking.mlflow.uri"] == (tmp_path / "runs" / "trk" / "mlruns").as_uri()
    assert params["env"] == "{}"
    assert tags["hpcsuite.slurm_job_id"] == str(payload["job_id"])
    assert tags["hpcsuite.attempt"] == "0" and tags["hpcsuite.status"] == "completed"
    if commit:
        assert tags["mlflow.source.git.commit"] == commit != git(tmp_path, "rev-parse", "HEAD")
        assert tags["hpcsuite.git_dirty"] == "true"
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
    synced_into_a_server_and_a_database(env, tmp_path, client, client.get_run(run.info.run_id))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def mlflow_server(work) -> tuple[subprocess.Popen, str]:
    """`mlflow server` on 127.0.0.1 with a SQLite store, as a site would run one; its URI once
    it answers."""
    port = free_port()
    mlflow_bin = os.path.join(os.path.dirname(sys.executable), "mlflow")
    server = subprocess.Popen(
        [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{work}/server.db"], cwd=work,
        stdout=open(work / "server.log", "w"), stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).read()
            return server, uri
        except OSError:
            assert server.poll() is None, (work / "server.log").read_text()[-3000:]
            time.sleep(0.5)
    server.kill()
    raise AssertionError("mlflow server never answered: " + (work / "server.log").read_text()[-3000:])


def artifact_paths(client, run_id, path=None) -> list[str]:
    out = []
    for f in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, f.path) if f.is_dir else [f.path]
    return sorted(out)


def same_run(source, run, target, copy_id) -> None:
    """The copy holds the run's params, tags, whole metric histories, artifacts and status."""
    copy = target.get_run(copy_id)
    assert copy.data.params == run.data.params
    assert {k: v for k, v in run.data.tags.items()} == \
        {k: v for k, v in copy.data.tags.items() if not k.startswith("hpcsuite.source")}
    assert copy.data.tags["hpcsuite.source_run_id"] == run.info.run_id
    assert (copy.info.status, copy.info.start_time, copy.info.end_time) == \
        (run.info.status, run.info.start_time, run.info.end_time)
    for key in run.data.metrics:
        def history(c, run_id):
            return sorted((m.step, m.timestamp, m.value) for m in c.get_metric_history(run_id, key))
        assert history(target, copy_id) == history(source, run.info.run_id), key
    assert artifact_paths(target, copy_id) == artifact_paths(source, run.info.run_id)


def synced_into_a_server_and_a_database(env, work, source, run) -> None:
    from hpcsuite.runs.mlflow_store import client_for

    server, uri = mlflow_server(work)
    try:
        out = run_cli("tracking", "sync", "trk", "--to", uri, "--json", cwd=work, env=env,
                      check=True, timeout=300)
        [done] = json.loads(out.stdout)
        assert done["created"] and done["artifacts"] >= 2 and done["status"] == "FINISHED", done
        target = client_for(uri)
        same_run(source, run, target, done["target_run"])
        assert target.get_experiment_by_name("trk") is not None
        again = run_cli("tracking", "sync", "trk", "--to", uri, cwd=work, env=env, check=True)
        assert again.stdout.strip().endswith("up to date (FINISHED), nothing added"), again.stdout
        [experiment] = [e.experiment_id for e in target.search_experiments() if e.name == "trk"]
        assert len(target.search_runs([experiment])) == 1
    finally:
        server.terminate()
        server.wait(30)
    out = run_cli("tracking", "sync", "trk", "--to", "sqlite:///synced.db", "--json", cwd=work,
                  env=env, check=True, timeout=300)
    [done] = json.loads(out.stdout)
    same_run(source, run, client_for(f"sqlite:///{work}/synced.db"), done["target_run"])


def test_a_preempted_and_requeued_job_continues_one_mlflow_run(preempted_script_job):
    """The shared preempted script job (tests/shared_observe.py), tracked: one rank, as the
    script uses no Horovod (each rank would be a world of its own)."""
    job = preempted_script_job
    log = job.log.read_text()
    assert job.state["state"] == "COMPLETED", log[-3000:]
    assert "hpcsuite script: preempted at step" in log

    r = json.loads((job.run_dir / "results.json").read_text())
    total, cut = r["final_step"], r["start_step"]     # cut: where attempt 0 saved and stopped
    assert (r["attempt"], r["status"]) == (1, "completed") and 5 <= cut < total
    client, run = mlflow_run(job.run_dir)
    assert len(client.search_runs([run.info.experiment_id])) == 1       # ONE MLflow run
    assert client.get_experiment(run.info.experiment_id).name == "preempted"
    assert run.info.status == "FINISHED"
    assert run.data.tags["hpcsuite.attempt"] == "1"
    assert run.data.tags["hpcsuite.slurm_job_id"] == job.job_id
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    steps = [s for s, _ in loss]
    assert steps[0] == 1 and steps[-1] == total
    assert any(s <= cut for s in steps) and any(s > cut for s in steps)   # both attempts'
    assert all(v == pytest.approx(10.0 / s, rel=1e-5) for s, v in loss)
    # As the job ended: the other tests' `hpcsuite report` adds its plots (report/) later.
    assert job.mlflow_artifacts == ["results.json"]


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


# A script that raises once MLflow has its run (rank 0 opens it on a thread of its own, seconds
# into the job): rank 0 dies without ending the run, and the batch script's `attempt end` does.
RAISES = """import os, pathlib, time
from hpcsuite.api import Run

run = Run()
record = pathlib.Path(os.environ["HPCSUITE_RUN_DIR"]) / "mlflow.json"
for _ in run.batches(1000):
    run.log(loss=1.0 / run.step)
    if run.step >= 3 and record.is_file():
        raise RuntimeError(f"boom at step {run.step}")
    time.sleep(0.2)
"""
FAILING = """name: boom
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  script: raises.py
  batch_size: 8
  epochs: 1
  tracking: {mlflow: {}}
"""


def test_a_failed_jobs_run_ends_failed_with_the_error(local_cluster, tmp_path):
    _, env = local_cluster
    (tmp_path / "raises.py").write_text(RAISES)
    (tmp_path / "boom.yaml").write_text(FAILING)
    out = run_cli("submit", "boom.yaml", "--wait", cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    job_id = out.stdout.split()[2].rstrip(";")
    run_dir = tmp_path / "runs" / "boom" / job_id
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FAILED" and run.info.end_time
    assert run.data.tags["hpcsuite.status"] == "failed"
    assert "RuntimeError: boom at step" in run.data.tags["hpcsuite.error"]
    log = (run_dir.parent / f"slurm-{job_id}.out").read_text()
    assert f"hpcsuite: MLflow run {run.info.run_id} ended FAILED (attempt 0 failed)" in log
    said = f"MLflow: run {run.info.run_id} (FAILED), experiment 'boom'"
    assert said in out.stderr, out.stderr                      # submit --wait
    status = run_cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert said in status, status


# Two tracked jobs at once: one whose server nobody listens on (it falls back to the run
# directory), one whose store cannot be made (a file stands where its directory would be).
QUIET = """name: {name}
resources: {{nodes: 1, tasks_per_node: 1, time: "00:05:00"}}
train:
  script: steps.py
  batch_size: 8
  epochs: 3
  tracking: {{mlflow: {{uri: "{uri}"}}}}
"""


def test_tracking_that_fell_back_or_was_lost_is_said_by_status_and_wait(local_cluster, tmp_path):
    cluster, env = local_cluster
    (tmp_path / "steps.py").write_text(STEPS)
    (tmp_path / "blocker").write_text("a file, not a directory")
    server = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "back.yaml").write_text(QUIET.format(name="back", uri=server))
    (tmp_path / "lost.yaml").write_text(QUIET.format(name="lost", uri="blocker/mlruns"))
    lint = run_cli("lint", "back.yaml", cwd=tmp_path, env=env)
    assert "cannot find mlflow" not in lint.stdout + lint.stderr      # this Python has it
    back = run_cli("submit", "back.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    lost = run_cli("submit", "lost.yaml", "--wait", "--json", cwd=tmp_path, env=env, timeout=600)
    payload = json.loads(lost.stdout)
    assert payload["tracking"]["state"] == "lost", payload
    assert payload["tracking"]["error"].startswith(("NotADirectoryError", "FileExistsError",
                                                    "MlflowException", "OSError")), payload
    status = run_cli("status", str(payload["job_id"]), cwd=tmp_path, env=env).stdout
    assert f"MLflow: lost in attempt 0: {payload['tracking']['error']}" in status, status
    assert follow_job(env, back, tmp_path, cluster)["state"] == "COMPLETED"
    status = run_cli("status", back, cwd=tmp_path, env=env).stdout
    run_dir = tmp_path / "runs" / "back" / back
    fallback = (run_dir / "mlruns").as_uri()
    assert f"fell back to {fallback} ({server}: server 127.0.0.1:" in status, status
    assert "not reachable from" in status
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED"


RESUMED = """name: res
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  model: mlp
  data: {samples: 256, shape: [16], classes: 4}
  batch_size: 32
  max_steps: 4
  checkpoint: {every_steps: 2}
  tracking: {mlflow: {}}
"""


def test_a_resubmission_that_resumes_a_checkpoint_names_the_run_it_continues(local_cluster,
                                                                             tmp_path):
    _, env = local_cluster
    (tmp_path / "res.yaml").write_text(RESUMED)
    first = json.loads(run_cli("submit", "res.yaml", "--wait", "--json", cwd=tmp_path, env=env,
                               check=True, timeout=600).stdout)
    second = json.loads(run_cli("submit", "res.yaml", "--set", "train.max_steps=6", "--wait",
                                "--json", cwd=tmp_path, env=env, check=True,
                                timeout=600).stdout)
    assert second["results"]["start_step"] == 4
    _, earlier = mlflow_run(tmp_path / second["run_dir"] / ".." / str(first["job_id"]))
    client, run = mlflow_run(tmp_path / second["run_dir"])
    assert run.info.run_id != earlier.info.run_id
    tags = run.data.tags
    assert tags["hpcsuite.continues_run"] == earlier.info.run_id
    assert tags["hpcsuite.resumed_from_job"] == str(first["job_id"])
    assert tags["hpcsuite.resumed_from"].endswith(second["results"]["resumed_from"].split("/")[-1])
    assert "hpcsuite.continues_run" not in earlier.data.tags
