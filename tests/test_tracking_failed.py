"""A failed tracked job leaves a trace (issue 51, point 10): a rank that fails before rank 0 has
opened its MLflow run leaves the batch script's `attempt end` to make the run rank 0 would
have made, FAILED, with the error, recorded for `status`; and `tracking sync` sends again an
artifact the job's store holds otherwise than the copy (a requeued attempt's results.json,
`report`'s plots drawn again). Local MLflow stores in tmp_path; tests/test_e2e_tracking.py
runs tracking through Slurm."""

import json
import os
import socket

import pytest

from conftest import run_cli
from hpcsuite.runs import mlflow_end, mlflow_run, mlflow_store, mlflow_sync
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import chart as chart_module
from hpcsuite.submit.spec import spec_from_dict
from test_tracking import client, record, script_run, train

mlflow = pytest.importorskip("mlflow")

COMMIT = "c0ffee" * 6 + "abcd"
MARKER = ("rank 1\nexit 1\nnode: n2\nraised: RuntimeError: boom 1.5 s in\nat: train.py:7\n"
          "Traceback (most recent call last):\n  File \"train.py\", line 7\n"
          "RuntimeError: boom 1.5 s in\n")


def spec(mlflow_key=None, name="s"):
    """script_run's job (test_tracking): what rank 0 would have logged is comparable."""
    return {"name": name, "train": {"script": "train.py", "batch_size": 4, "epochs": 3,
                                    "lr": 0.25, "tracking": {"mlflow": mlflow_key or {}}}}


def failed_attempt(tmp_path, monkeypatch, mlflow_key=None, run="77", attempt=0,
                   requeued=False):
    """A run directory as the batch script leaves it when a rank raised before rank 0 opened
    its MLflow run: the attempt recorded failed, rank 1's FAILED marker, no mlflow.json."""
    monkeypatch.setenv("SLURM_JOB_ID", run)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(attempt))
    monkeypatch.setenv(mlflow_store.GIT_COMMIT, COMMIT)
    monkeypatch.setenv(mlflow_store.GIT_DIRTY, "false")
    job = spec_from_dict(spec(mlflow_key), "t")
    run_dir = tmp_path / "runs" / "s" / run
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = RunDir(run_dir)
    paths.job.write_text(json.dumps(job.to_dict()))
    paths.failed(attempt).write_text(MARKER)
    with paths.attempts.open("a") as f:
        f.write(json.dumps({"attempt": attempt, "outcome": "failed", "exit": 1,
                            "requeued": requeued}) + "\n")
    return job, run_dir


# ------------------------------------------------------------------- attempt end
def test_attempt_end_makes_the_failed_run_rank_0_never_opened(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    rank0, _ = script_run(tmp_path, run="1")      # a run rank 0 opened, to compare with
    train(rank0)
    theirs = client(record(tmp_path / "runs" / "s" / "1")["uri"]).get_run(
        record(tmp_path / "runs" / "s" / "1")["run_id"])
    job, run_dir = failed_attempt(tmp_path, monkeypatch)
    assert not RunDir(run_dir).mlflow.exists()
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)
    rec = record(run_dir)
    uri = (tmp_path / "runs" / "s" / "mlruns").as_uri()      # the store rank 0 would have used
    assert said == [f"hpcsuite: MLflow run {rec['run_id']} made FAILED by attempt end (rank 0 "
                    f"never opened one; attempt 0 failed) at {uri}"]
    assert (rec["uri"], rec["experiment"], rec["state"], rec["status"], rec["attempt"]) == \
        (uri, "s", "ended", "FAILED", 0)
    assert (rec["made_by"], rec["made_in"], rec["fell_back"]) == ("attempt end", 0, None)
    got = client(uri).get_run(rec["run_id"])
    assert got.info.status == "FAILED" and got.info.end_time
    assert got.info.run_name == "s-77" and got.info.experiment_id == theirs.info.experiment_id
    assert got.data.params == theirs.data.params            # the spec, as rank 0 logs it
    tags = got.data.tags
    assert set(theirs.data.tags) - {"mlflow.source.git.commit"} <= set(tags)
    assert tags["hpcsuite.slurm_job_id"] == "77" and tags["hpcsuite.attempt"] == "0"
    assert tags["mlflow.source.git.commit"] == COMMIT and tags["hpcsuite.git_dirty"] == "false"
    assert tags["hpcsuite.spec_digest"] == job.digest()
    assert tags["hpcsuite.status"] == "failed"
    assert tags["hpcsuite.error"] == "RuntimeError: boom 1.5 s in"     # the FAILED marker's
    assert tags[mlflow_end.MADE_BY_TAG] == "attempt end"
    assert mlflow_store.summary_line(run_dir) == (
        f"MLflow: run {rec['run_id']} (FAILED, made by attempt end: rank 0 never opened one), "
        f"experiment 's', at {uri}")
    assert mlflow_store.summary(run_dir)["made_by"] == "attempt end"   # status --json
    said.clear()                           # ended now: a second call has nothing to do
    mlflow_end.end_attempt(job, run_dir, said.append)
    assert said == [] and len(client(uri).search_runs([got.info.experiment_id])) == 2


def test_the_batch_scripts_attempt_end_leaves_the_trace_and_keeps_the_launchers_status(
        tmp_path, monkeypatch):
    job, run_dir = failed_attempt(tmp_path, monkeypatch)
    RunDir(run_dir).attempts.unlink()             # `attempt end` records the attempt itself
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0",
           mlflow_store.GIT_COMMIT: COMMIT}
    env.pop(mlflow_store.ALLOW, None)
    done = run_cli("attempt", "end", "--run-dir", str(run_dir), "--status", "1", env=env)
    assert done.returncode == 1, done.stderr
    rec = record(run_dir)
    assert f"MLflow run {rec['run_id']} made FAILED by attempt end" in done.stdout
    got = client(rec["uri"]).get_run(rec["run_id"])
    assert got.info.status == "FAILED"
    assert got.data.tags["hpcsuite.error"] == "RuntimeError: boom 1.5 s in"
    assert got.data.tags["mlflow.source.git.commit"] == COMMIT
    # a store that cannot be made: one line in the job's log, the launcher's status kept
    bad, bad_dir = failed_attempt(tmp_path, monkeypatch, run="78")
    (tmp_path / "a-file").write_text("")
    bad_job = spec_from_dict(spec({"uri": str(tmp_path / "a-file" / "mlruns")}), "t")
    RunDir(bad_dir).job.write_text(json.dumps(bad_job.to_dict()))
    RunDir(bad_dir).attempts.unlink()
    done = run_cli("attempt", "end", "--run-dir", str(bad_dir), "--status", "1",
                   env={**env, "SLURM_JOB_ID": "78"})
    assert done.returncode == 1, done.stderr
    [line] = [l for l in done.stdout.splitlines() if "MLflow" in l]
    assert line.startswith("hpcsuite: no MLflow run made for attempt 0 (rank 0 never opened "
                           "one): ") and "a-file" in line
    assert "Traceback" not in done.stdout + done.stderr
    assert not RunDir(bad_dir).mlflow.exists()


def test_an_mlflow_failure_in_attempt_end_is_one_line_never_an_exception(tmp_path, monkeypatch):
    job, run_dir = failed_attempt(tmp_path, monkeypatch)

    def refuse(*a, **kw):
        raise RuntimeError("the store said no\nsecond line")
    monkeypatch.setattr(mlflow_end, "experiment_id", refuse)
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)
    assert said == ["hpcsuite: no MLflow run made for attempt 0 (rank 0 never opened one): "
                    "RuntimeError: the store said no"]
    monkeypatch.setattr(mlflow_end, "make_run", refuse)     # anything else: one line too
    said.clear()
    mlflow_end.end_attempt(job, run_dir, said.append)
    assert said == ["hpcsuite: MLflow: attempt 0's run not ended (RuntimeError: the store "
                    "said no)"]


def test_a_loss_rank_0_recorded_stays_said_beside_the_run_attempt_end_made(tmp_path,
                                                                             monkeypatch):
    job, run_dir = failed_attempt(tmp_path, monkeypatch)
    lost = "TimeoutError: the MLflow run was not open 120 s after the attempt's end"
    mlflow_store.write_record(RunDir(run_dir).mlflow, {"attempt": 0, "state": "lost",
                                                       "error": lost})
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)
    rec = record(run_dir)
    assert said[0].startswith(f"hpcsuite: MLflow run {rec['run_id']} made FAILED")
    assert mlflow_store.summary_line(run_dir) == (
        f"MLflow: run {rec['run_id']} (FAILED, made by attempt end: rank 0 never opened one), "
        f"experiment 's', at {rec['uri']}; lost in attempt 0: {lost}")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_server_out_of_reach_from_the_batch_node_gets_the_run_in_the_run_directory(
        tmp_path, monkeypatch):
    server = f"http://127.0.0.1:{closed_port()}"
    job, run_dir = failed_attempt(tmp_path, monkeypatch, {"uri": server})
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)
    rec = record(run_dir)
    assert rec["uri"] == RunDir(run_dir).mlruns.absolute().as_uri()   # as rank 0 falls back
    assert rec["asked"] == server and rec["fell_back"].startswith(f"{server}: server ")
    got = client(rec["uri"]).get_run(rec["run_id"])
    assert got.info.status == "FAILED"
    assert got.data.params["train.tracking.mlflow.uri"] == rec["uri"]
    line = mlflow_store.summary_line(run_dir)
    assert "made by attempt end: rank 0 never opened one" in line and "fell back to" in line


def test_a_requeued_attempt_continues_the_run_attempt_end_made(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    job, run_dir = failed_attempt(tmp_path, monkeypatch, run="1", requeued=True)
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)
    made = record(run_dir)
    assert said[0].startswith(f"hpcsuite: MLflow run {made['run_id']} made KILLED")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second, _ = script_run(tmp_path, run="1")
    train(second)
    rec = record(run_dir)
    assert rec["run_id"] == made["run_id"] and (rec["attempt"], rec["status"]) == (1, "FINISHED")
    got = client(rec["uri"]).get_run(rec["run_id"])
    assert got.info.status == "FINISHED" and got.data.tags["hpcsuite.attempt"] == "1"
    assert got.data.params == mlflow_run.run_params(job, rec["uri"], "s")
    assert mlflow_store.summary_line(run_dir) == (
        f"MLflow: run {rec['run_id']} (FINISHED, made by attempt 0's end: its rank 0 never "
        f"opened one), experiment 's', at {rec['uri']}")


# ------------------------------------------------------------------- tracking sync
def artifact_text(c, run_id, path, tmp_path):
    out = tmp_path / "got"
    out.mkdir(exist_ok=True)
    return open(c.download_artifacts(run_id, path, str(out)), "rb").read()


def test_sync_sends_again_an_artifact_that_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    first, run_dir = script_run(tmp_path)
    train(first)
    plot = tmp_path / "loss.png"
    plot.write_bytes(b"A" * 100)
    assert mlflow_store.add_plots(run_dir, [plot]).startswith("MLflow: 1 plots added")
    to = f"sqlite:///{tmp_path / 'm.db'}"
    done = mlflow_sync.sync([run_dir], to)[0]
    assert done.created and (done.artifacts, done.artifacts_changed) == (2, 0)
    before = (run_dir / "results.json").read_bytes()
    # The job requeued: attempt 1 publishes its results.json, `report` draws the plot again
    # (the same size), and both are overwritten in the job's store.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second, _ = script_run(tmp_path)
    train(second, scale=2.0)
    plot.write_bytes(b"B" * 100)
    mlflow_store.add_plots(run_dir, [plot])
    after = (run_dir / "results.json").read_bytes()
    assert after != before
    again = mlflow_sync.sync([run_dir], to)[0]
    assert again.error is None and not again.created, again
    assert (again.artifacts, again.artifacts_changed) == (2, 2)
    assert "2 artifacts (2 changed)" in again.line()
    target = client(to)
    assert artifact_text(target, again.target_run, "results.json", tmp_path) == after
    assert artifact_text(target, again.target_run, "report/loss.png", tmp_path) == b"B" * 100
    assert mlflow_sync.sync([run_dir], to)[0].line().endswith(
        "up to date (FINISHED), nothing added")


def test_sync_compares_a_copy_sent_before_digests_were_recorded_by_its_content(tmp_path,
                                                                               monkeypatch):
    run, run_dir = script_run(tmp_path)
    train(run)
    plot = tmp_path / "loss.png"
    plot.write_bytes(b"A" * 100)
    mlflow_store.add_plots(run_dir, [plot])
    to = f"sqlite:///{tmp_path / 'm.db'}"
    done = mlflow_sync.sync([run_dir], to)[0]
    target = client(to)
    digests = json.loads(target.get_run(done.target_run).data.tags[mlflow_sync.DIGESTS_TAG])
    assert sorted(digests) == ["report/loss.png", "results.json"]
    target.delete_tag(done.target_run, mlflow_sync.DIGESTS_TAG)    # a copy an older sync made
    assert not mlflow_sync.sync([run_dir], to)[0].added          # the same content: not sent
    assert mlflow_sync.DIGESTS_TAG in target.get_run(done.target_run).data.tags
    target.delete_tag(done.target_run, mlflow_sync.DIGESTS_TAG)
    plot.write_bytes(b"C" * 100)                                  # the same size, changed
    mlflow_store.add_plots(run_dir, [plot])
    again = mlflow_sync.sync([run_dir], to)[0]
    assert (again.artifacts, again.artifacts_changed) == (1, 1)
    assert artifact_text(target, done.target_run, "report/loss.png", tmp_path) == b"C" * 100
