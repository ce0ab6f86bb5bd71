"""A run's MLflow record (mlflow.json) and what reads it, without a cluster: reading the job's
own file store with MLflow's client as docs/user/outputs.md says, the line `status` and
`submit --wait` print, `attempt end` closing a run rank 0 left open, `tracking sync` into a
SQLite database (added once, nothing the second time), the commit recorded at submit, the run a
resubmission continues, and lint's check for mlflow in the job's Python.
tests/test_e2e_tracking.py runs them through Slurm and syncs into a real `mlflow server`."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsuite.errors import UserError
from hpcsuite.runs import mlflow_end, mlflow_run, mlflow_store, mlflow_sync
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import chart as chart_module
from hpcsuite.submit.site_profile import SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.tracking import tracking_problems
from test_tracking import client, record, script_run, train

mlflow = pytest.importorskip("mlflow")
REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------- reading the job's store
def docs_block(lang: str, needle: str) -> str:
    """The block of docs/user/outputs.md in ``lang`` that holds ``needle``."""
    text = (REPO / "docs" / "user" / "outputs.md").read_text()
    found = [b for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S) if needle in b]
    assert found, f"no {lang} block with {needle!r} in docs/user/outputs.md"
    return found[0]


def test_mlflows_own_client_reads_the_jobs_store_as_the_docs_say(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    run, run_dir = script_run(tmp_path, name="trk")
    train(run)
    run_id = record(run_dir)["run_id"]
    snippet = docs_block("python", "MLFLOW_ALLOW_FILE_STORE")      # as a user types it
    check = snippet + f"\nprint(client.get_run({run_id!r}).info.status)\n"
    env = {k: v for k, v in os.environ.items() if k != mlflow_store.ALLOW}
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-1] == "FINISHED", done.stderr[-2000:]
    # why the docs say it: MLflow 3.17 refuses the file store without the variable
    bare = "\n".join(l for l in snippet.splitlines() if mlflow_store.ALLOW not in l)
    done = subprocess.run([sys.executable, "-c", bare], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and mlflow_store.ALLOW in done.stderr


def test_hpcsuites_own_client_leaves_the_environment_as_it_was(tmp_path, monkeypatch):
    for key in (mlflow_store.ALLOW, *mlflow_store.HTTP_DEFAULTS):
        monkeypatch.delenv(key, raising=False)
    before = dict(os.environ)
    c = mlflow_store.client_for((tmp_path / "mlruns").as_uri())
    assert dict(os.environ) == before        # no MLFLOW_* left behind on the login node
    made = c.create_experiment("x")        # the store made while allowed is used after
    assert c.get_experiment_by_name("x").experiment_id == made



def test_mlflows_environment_holds_while_a_client_is_used_and_goes_after(monkeypatch):
    for key in (mlflow_store.ALLOW, *mlflow_store.HTTP_DEFAULTS):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")     # the user's own stays
    before = dict(os.environ)
    with mlflow_store.mlflow_environment():
        assert os.environ[mlflow_store.ALLOW] == "true"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
        with mlflow_store.mlflow_environment():
            pass
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"   # the outer one still holds
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError), mlflow_store.mlflow_environment():
        raise RuntimeError("MLflow failed")
    assert dict(os.environ) == before

# ------------------------------------------------------------------- what status says
def test_the_status_line_names_the_run_a_fall_back_and_a_loss(tmp_path):
    path = RunDir(tmp_path).mlflow
    assert mlflow_store.summary_line(tmp_path) is None           # a run that does not track
    base = {"uri": "file:///o/r/mlruns", "run_id": "abc", "experiment": "e", "attempt": 0}
    mlflow_store.write_record(path, {**base, "state": "ended", "status": "FAILED"})
    assert mlflow_store.summary_line(tmp_path) == \
        "MLflow: run abc (FAILED), experiment 'e', at file:///o/r/mlruns"
    mlflow_store.write_record(path, {**base, "state": "logging",
                                     "fell_back": "http://h:5000: server h:5000 not reachable"})
    assert mlflow_store.summary_line(tmp_path) == (
        "MLflow: run abc, experiment 'e', at file:///o/r/mlruns; fell back to file:///o/r/mlruns "
        "(http://h:5000: server h:5000 not reachable)")
    mlflow_store.write_record(path, {"attempt": 1, "state": "lost",
                                     "error": "ImportError: No module named 'mlflow'"})
    assert mlflow_store.summary_line(tmp_path) == \
        "MLflow: lost in attempt 1: ImportError: No module named 'mlflow'"
    assert mlflow_store.summary(tmp_path)["state"] == "lost"


# ------------------------------------------------------------------- attempt end
@pytest.mark.parametrize("outcome, requeued, slurm_ended, want", [
    ("completed", False, False, "FINISHED"), ("failed", False, False, "FAILED"),
    ("failed", True, False, "KILLED"), ("failed", False, True, "KILLED"),
    ("preempted", True, False, "KILLED"), ("time_limit", False, False, "KILLED"),
    ("stopped", False, False, "KILLED"), ("lost", False, False, "FAILED"),
])
def test_the_status_a_run_left_open_gets(outcome, requeued, slurm_ended, want):
    assert mlflow_end.mlflow_status(outcome, requeued, slurm_ended) == want


def open_run(tmp_path, monkeypatch):
    """A run rank 0 opened and never ended (it died): RUNNING in the job's file store, and
    mlflow.json says logging."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    uri = (tmp_path / "runs" / "s" / "mlruns").as_uri()
    c = client(uri)
    experiment = c.create_experiment("s")
    run = c.create_run(experiment, run_name="s-1")
    c.log_metric(run.info.run_id, "loss", 1.0, step=1)
    run_dir = tmp_path / "runs" / "s" / "1"
    run_dir.mkdir(parents=True)
    mlflow_store.write_record(RunDir(run_dir).mlflow, {
        "uri": uri, "run_id": run.info.run_id, "experiment": "s", "experiment_id": experiment,
        "attempt": 0, "state": "logging"})
    return run_dir, record(run_dir)


def test_attempt_end_fails_a_run_rank_0_left_running(tmp_path, monkeypatch):
    run_dir, rec = open_run(tmp_path, monkeypatch)
    assert rec["state"] == "logging"
    c = client(rec["uri"])
    assert c.get_run(rec["run_id"]).info.status == "RUNNING"
    RunDir(run_dir).failed(0).write_text("rank 1\nexit 1\nnode: n2\nraised: RuntimeError: "
                                         "boom\nat: train.py:3\nTraceback ...\n")
    job = spec_from_dict({"name": "s", "train": {"script": "t.py",
                                                 "tracking": {"mlflow": {}}}}, "t")
    said = []
    mlflow_end.end_attempt(job, run_dir, said.append)           # no record of the attempt
    assert said == [] and c.get_run(rec["run_id"]).info.status == "RUNNING"
    RunDir(run_dir).attempts.write_text(json.dumps({"attempt": 0, "outcome": "failed",
                                                    "exit": 1, "requeued": False}) + "\n")
    mlflow_end.end_attempt(job, run_dir, said.append)
    assert said == [f"hpcsuite: MLflow run {rec['run_id']} ended FAILED (attempt 0 failed)"]
    got = c.get_run(rec["run_id"])
    assert got.info.status == "FAILED" and got.info.end_time
    assert got.data.tags["hpcsuite.status"] == "failed"
    assert got.data.tags["hpcsuite.error"] == "RuntimeError: boom"
    assert (record(run_dir)["state"], record(run_dir)["status"]) == ("ended", "FAILED")
    said.clear()            # ended now: a second call has nothing to do (no MLflow import)
    mlflow_end.end_attempt(job, run_dir, said.append)
    assert said == []


def test_a_requeued_failure_stays_resumable_and_the_next_attempt_continues(tmp_path, monkeypatch):
    run_dir, rec = open_run(tmp_path, monkeypatch)
    said = mlflow_end.close_run(run_dir, 0, "failed", requeued=True)
    assert said.endswith("ended KILLED (attempt 0 failed)")
    c = client(rec["uri"])
    assert c.get_run(rec["run_id"]).data.tags["hpcsuite.status"] == "failed, requeued"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second, _ = script_run(tmp_path)
    train(second)
    again = record(run_dir)
    assert again["run_id"] == rec["run_id"] and again["attempt"] == 1
    got = c.get_run(rec["run_id"])
    assert got.info.status == "FINISHED" and got.data.tags["hpcsuite.status"] == "completed"


def test_a_run_rank_0_ended_is_left_alone_and_a_run_without_tracking_too(tmp_path, monkeypatch):
    run, run_dir = script_run(tmp_path)
    train(run)
    assert mlflow_end.close_run(run_dir, 0, "failed") is None
    assert client(record(run_dir)["uri"]).get_run(record(run_dir)["run_id"]).info.status == \
        "FINISHED"
    assert mlflow_end.close_run(tmp_path / "elsewhere", 0, "failed") is None
    job = spec_from_dict({"name": "s"}, "t")            # no tracking: mlflow.json not read
    RunDir(run_dir).attempts.write_text('{"attempt": 0, "outcome": "failed"}\n')
    mlflow_end.end_attempt(job, run_dir, pytest.fail)


# ------------------------------------------------------------------- tracking sync
def test_sync_into_sqlite_copies_everything_once(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    run, run_dir = script_run(tmp_path)
    train(run)
    rec = record(run_dir)
    source = client(rec["uri"])
    src = source.get_run(rec["run_id"])
    db = tmp_path / "sync" / "m.db"
    db.parent.mkdir()
    monkeypatch.chdir(db.parent)
    [done] = mlflow_sync.sync([run_dir], "sqlite:///m.db")          # relative to here
    assert done.created and done.error is None and done.skipped is None, done
    assert done.params == len(src.data.params) and done.artifacts == 1
    target = client(f"sqlite:///{db}")
    copy = target.get_run(done.target_run)
    assert copy.data.params == src.data.params
    assert {k: v for k, v in copy.data.tags.items() if not k.startswith("hpcsuite.source")} \
        == src.data.tags
    assert copy.data.tags[mlflow_sync.SOURCE_TAG] == rec["run_id"]
    assert (copy.info.status, copy.info.start_time, copy.info.end_time) == \
        (src.info.status, src.info.start_time, src.info.end_time)
    for key in src.data.metrics:
        def history(c, run_id):
            return sorted((m.step, m.timestamp, m.value) for m in c.get_metric_history(run_id, key))
        assert history(target, done.target_run) == history(source, rec["run_id"]), key
    assert [f.path for f in target.list_artifacts(done.target_run)] == ["results.json"]
    assert target.list_artifacts(done.target_run)[0].file_size == \
        (run_dir / "results.json").stat().st_size
    assert (db.parent / "mlartifacts").is_dir()            # beside the database
    again = mlflow_sync.sync([run_dir], f"sqlite:///{db}")[0]
    assert not again.added and again.target_run == done.target_run
    assert again.line().endswith("up to date (FINISHED), nothing added")
    assert len(target.search_runs([copy.info.experiment_id])) == 1


def test_sync_completes_a_copy_made_while_the_run_ran(tmp_path, monkeypatch):
    run_dir, rec = open_run(tmp_path, monkeypatch)
    to = f"sqlite:///{tmp_path / 'm.db'}"
    first = mlflow_sync.sync([run_dir], to)[0]
    assert first.created and first.status == "RUNNING"
    mlflow_end.close_run(run_dir, 0, "failed")        # the job failed after the first sync
    source = client(rec["uri"])
    source.log_metric(rec["run_id"], "late", 2.0, step=11)
    second = mlflow_sync.sync([run_dir], to)[0]
    assert not second.created and second.metrics == 1 and second.status_changed
    assert second.status == "FAILED" and second.tags >= 2      # hpcsuite.status, .error...
    copy = client(to).get_run(first.target_run)
    assert copy.info.status == "FAILED" and copy.data.metrics["late"] == 2.0


def test_sync_says_what_it_cannot_do_in_one_line(tmp_path):
    for bad in ("postgresql://db/x", "sqlite://", "runs/x"):
        with pytest.raises(UserError, match="not a tracking server or database"):
            mlflow_sync.target_uri(bad)
    with pytest.raises(UserError, match="not reachable"):
        mlflow_sync.target_uri("http://127.0.0.1:1")
    [done] = mlflow_sync.sync([tmp_path], f"sqlite:///{tmp_path / 'm.db'}")
    assert done.skipped and done.line().startswith(f"{tmp_path}: skipped: no MLflow run")


def test_the_sync_command_loads_no_mlflow_until_it_runs():
    probe = ("import sys; from hpcsuite.cli import main, tracking_cmd; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# ------------------------------------------------------------------- tags
def test_the_commit_recorded_at_submit_is_tagged_not_the_working_trees(monkeypatch):
    monkeypatch.setenv(mlflow_store.GIT_COMMIT, "a" * 40)
    monkeypatch.setenv(mlflow_store.GIT_DIRTY, "true")
    assert mlflow_run.git_tags() == {"mlflow.source.git.commit": "a" * 40,
                                   "hpcsuite.git_dirty": "true"}
    monkeypatch.setenv(mlflow_store.GIT_COMMIT, "")        # submitted from outside a repository
    assert mlflow_run.git_tags() == {}
    monkeypatch.delenv(mlflow_store.GIT_COMMIT)             # a script tried by hand
    assert mlflow_run.git_tags() == {"mlflow.source.git.commit": mlflow_run.git_commit(Path.cwd())}


def test_the_runner_hands_the_commit_to_sbatch_only_for_a_job_that_tracks(tmp_path):
    from hpcsuite.runner.submit import git_env

    class Request:
        workdir = str(tmp_path)
        job = spec_from_dict({"name": "s", "train": {"tracking": {"mlflow": {}}}}, "t")
    assert git_env(Request()) == {mlflow_store.GIT_COMMIT: "", mlflow_store.GIT_DIRTY: ""}
    Request.job = spec_from_dict({"name": "s"}, "t")
    assert git_env(Request()) == {}


def test_a_resubmission_is_tagged_with_the_run_it_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    first, run_dir = script_run(tmp_path, run="100")
    train(first)
    earlier = record(run_dir)["run_id"]
    monkeypatch.setenv("SLURM_JOB_ID", "200")
    second, second_dir = script_run(tmp_path, run="200")
    second.session.tracker.resumed(Path("/ck/step-9"), "100")
    train(second)
    tags = client(record(second_dir)["uri"]).get_run(record(second_dir)["run_id"]).data.tags
    assert tags["hpcsuite.continues_run"] == earlier
    assert tags["hpcsuite.resumed_from_job"] == "100"
    assert tags["hpcsuite.resumed_from"] == "/ck/step-9"


# ------------------------------------------------------------------- lint
def test_lint_warns_when_the_jobs_python_cannot_find_mlflow(tmp_path):
    job = spec_from_dict({"name": "s", "train": {"tracking": {"mlflow": {}}}}, "t")
    assert tracking_problems(job, SiteProfile()) == []          # this Python has it
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    [said] = tracking_problems(job, SiteProfile(python=str(bare / "bin" / "python")))
    assert "cannot find mlflow" in said and str(bare) in said
    [said] = tracking_problems(job, SiteProfile(python=str(tmp_path / "nope")))
    assert "cannot be run here" in said
    assert tracking_problems(spec_from_dict({"name": "s"}, "t"),
                             SiteProfile(python=str(tmp_path / "nope"))) == []
