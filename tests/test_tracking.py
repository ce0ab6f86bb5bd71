"""train.tracking (MLflow) without a cluster: the spec key and the site's URI, the params, the
fallback when the server cannot be reached, what rank 0 logs in script mode read back with
MLflow's own client, a second attempt continuing the same MLflow run, and failures that turn
tracking off without touching training. tests/test_e2e_tracking.py runs it through Slurm."""

import json
import logging
import socket
import subprocess
import sys

import pytest

from hpcsuite import api
from hpcsuite.errors import UserError
from hpcsuite.runs import mlflow_run, mlflow_store
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import chart as chart_module
from hpcsuite.runtime.observe import tracking
from hpcsuite.submit.spec import spec_from_dict

mlflow = pytest.importorskip("mlflow")


def client(uri):
    return mlflow_store.client_for(uri)     # MLflow's own MlflowClient (file stores allowed)


def record(run_dir) -> dict:
    return json.loads(RunDir(run_dir).mlflow.read_text())


# ------------------------------------------------------------------- the spec
@pytest.mark.parametrize("mlflow_key, message", [
    ({"uri": "postgresql://db/x"}, "postgresql: is not a tracking URI"),
    ({"uri": "sqlite://host/m.db"}, "a SQLite database is sqlite:///PATH"),
    ({"uri": "sqlite:///:memory:"}, "a SQLite database is sqlite:///PATH"),
    ({"uri": "http://"}, "no host"),
    ({"uri": "https://h:70000"}, "out of range"),
    ({"uri": "file:"}, "needs a path"),
    ({"uri": ""}, "must not be empty"),
    ({"experiment": ""}, "must not be empty"),
    ({"experiment": "x" * 201}, "longer than 200"),
    ({"experimnt": "x"}, "unknown key"),
])
def test_bad_tracking_keys_name_the_key_in_one_line(mlflow_key, message):
    with pytest.raises(UserError, match=message) as e:
        spec_from_dict({"name": "s", "train": {"tracking": {"mlflow": mlflow_key}}}, "job.yaml")
    assert str(e.value).startswith("job.yaml: train.tracking.mlflow.")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("uri", ["file:///srv/mlruns", "mlruns", "../shared/mlruns",
                                 "http://mlflow.site:5000", "https://mlflow.site/prefix",
                                 "sqlite:///mlflow.db", "sqlite:////srv/mlflow.db"])
def test_good_uris(uri):
    job = spec_from_dict({"name": "s", "train": {"tracking": {"mlflow": {"uri": uri}}}}, "j")
    assert job.train.tracking.mlflow.uri == uri


def test_off_by_default_and_job_json_as_before():
    job = spec_from_dict({"name": "s"}, "j")
    assert job.train.tracking is None and "tracking" not in job.to_dict()["train"]
    on = spec_from_dict({"name": "s", "train": {"tracking": {"mlflow": {}}}}, "j")
    assert on.to_dict()["train"]["tracking"] == {"mlflow": {"uri": None, "experiment": None}}
    assert on.digest() != job.digest()


def test_cli_refuses_a_bad_uri_with_exit_2_naming_file_and_key(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\ntrain:\n  tracking:\n    mlflow: {uri: 'postgresql://db/x'}\n")
    out = subprocess.run([sys.executable, "-m", "hpcsuite", "render", str(spec)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "job.yaml" in lines[0] and "train.tracking.mlflow.uri" in lines[0]


def test_the_site_profile_names_the_default_uri(tmp_path):
    from hpcsuite.submit.config import resolve
    from hpcsuite.submit.plan import plan
    from hpcsuite.submit.templating import SearchPath

    (tmp_path / "profile.yaml").write_text("tracking_uri: http://mlflow.site:5000\n")
    for tracking_key, want in (("{mlflow: {}}", "http://mlflow.site:5000"),
                               ("{mlflow: {uri: mine}}", "mine")):
        (tmp_path / "job.yaml").write_text(f"name: t\ntrain:\n  tracking: {tracking_key}\n")
        r = resolve(str(tmp_path / "job.yaml"), str(tmp_path / "profile.yaml"), cwd=tmp_path,
                    ambient=False)
        request = plan(r.job, r.profile, SearchPath.builtin_only(), r.locks)
        assert request.job.train.tracking.mlflow.uri == want
        assert f'"uri":"{want}"' in request.script.replace(": ", ":")
    (tmp_path / "job.yaml").write_text("name: t\n")       # no tracking: nothing added
    r = resolve(str(tmp_path / "job.yaml"), str(tmp_path / "profile.yaml"), cwd=tmp_path,
                ambient=False)
    assert "tracking" not in plan(r.job, r.profile, SearchPath.builtin_only(), r.locks).script
    (tmp_path / "profile.yaml").write_text("tracking_uri: 'mysql://db/x'\n")
    with pytest.raises(UserError, match=r"profile\.yaml.*tracking_uri"):
        resolve(str(tmp_path / "job.yaml"), str(tmp_path / "profile.yaml"), cwd=tmp_path,
                ambient=False)


# ------------------------------------------------------------------- pure parts
def test_params_flatten_the_spec_with_env_names_only_and_long_values_cut():
    spec = spec_from_dict({"name": "s", "env": {"TOKEN": "secret", "A": "1"}, "train": {
        "lr": 0.1, "args": ["x" * 4000, "y" * 4000], "model_args": {"width": 8},
        "tracking": {"mlflow": {}}}}, "j").to_dict()
    params = mlflow_run.flat_params(spec)
    assert mlflow_run.flat_params({"env": {}})["env"] == "{}"         # a value, not empty
    assert params["train.lr"] == "0.1" and params["name"] == "s"
    assert params["train.model_args.width"] == "8"
    assert params["train.epochs"] == "null" and params["train.ledger"] == "false"
    assert params["resources.nodes"] == "1"
    assert params["env"] == "A,TOKEN" and "secret" not in json.dumps(params)
    assert len(params["train.args"]) == mlflow_run.PARAM_CHARS and params["train.args"].endswith("...")
    assert all(len(v) <= mlflow_run.PARAM_CHARS for v in params.values())


def test_metric_names_mlflow_refuses_are_mended():
    assert tracking.metric_key("utilisation/rank0/cpu_percent") == "utilisation/rank0/cpu_percent"
    assert tracking.metric_key("acc@1 (top)") == "acc_1 _top_"


def test_git_commit_from_files_loose_and_packed(tmp_path):
    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    sub = tmp_path / "repo" / "jobs" / "x"
    sub.mkdir(parents=True)
    assert mlflow_run.git_commit(sub) == "a" * 40
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs\n{'b' * 40} refs/heads/main\n")
    assert mlflow_run.git_commit(sub) == "b" * 40
    (git / "HEAD").write_text("c" * 40 + "\n")                 # detached
    assert mlflow_run.git_commit(sub) == "c" * 40


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_unreachable_server_falls_back_to_the_run_directory(tmp_path, caplog):
    paths = RunDir(tmp_path / "runs" / "s" / "7")
    uri = f"http://127.0.0.1:{closed_port()}"
    with caplog.at_level(logging.WARNING):
        got, why = tracking.reachable(uri, paths)
    assert got == paths.mlruns.absolute().as_uri()
    assert why.startswith(f"{uri}: server 127.0.0.1:") and "not reachable from" in why
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"train.tracking.mlflow.uri: {uri}: server 127.0.0.1")
    assert str(paths.mlruns) in line
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    try:
        up = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert tracking.reachable(up, paths) == (up, None)
    finally:
        listening.close()
    assert tracking.reachable("file:///x", paths) == ("file:///x", None)


def test_store_uri_default_path_and_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = RunDir(tmp_path / "runs" / "s" / "7")
    assert mlflow_run.store_uri(None, paths) == (tmp_path / "runs" / "s" / "mlruns").as_uri()
    assert mlflow_run.store_uri("shared/ml runs", paths) == (tmp_path / "shared/ml runs").as_uri()
    assert mlflow_run.store_uri("HTTP://h:1", paths) == "HTTP://h:1"
    assert mlflow_run.store_uri("sqlite:///m.db", paths) == f"sqlite:///{tmp_path}/m.db"
    assert mlflow_run.store_uri("sqlite:////srv/m.db", paths) == "sqlite:////srv/m.db"


# ------------------------------------------------------------------- rank 0, in this process
def script_run(tmp_path, mlflow_key=None, name="s", run="1"):
    job = spec_from_dict({"name": name, "train": {
        "script": "train.py", "batch_size": 4, "epochs": 3, "lr": 0.25,
        "tracking": {"mlflow": mlflow_key or {}}}}, "t")
    run_dir = tmp_path / "runs" / name / run
    run_dir.mkdir(parents=True, exist_ok=True)
    return api.Run(None, job=job, run_dir=run_dir), run_dir


def train(run, scale=1.0):
    for _ in run.batches(10):                        # 3 steps an epoch, 3 epochs
        run.log(loss=scale / (run.step + 1))
    run.finish()


def test_script_mode_logs_params_tags_metrics_and_results(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)      # every step, to compare them all
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    run, run_dir = script_run(tmp_path)
    train(run)
    rec = record(run_dir)
    assert rec["uri"] == (tmp_path / "runs" / "s" / "mlruns").as_uri()   # the default store
    c = client(rec["uri"])
    got = c.get_run(rec["run_id"])
    assert got.info.status == "FINISHED" and got.info.run_name == "s-1"
    assert c.get_experiment(got.info.experiment_id).name == "s"
    params = got.data.params
    # what the script was given, not the managed loop's defaults it never reads
    assert params["train.batch_size"] == "4" and params["name"] == "s"
    assert params["train.script"] == "train.py" and params["train.epochs"] == "3"
    assert not {"train.lr", "train.model", "train.optimizer.name", "train.data.kind",
                "train.horovod.compression"} & set(params)
    assert params["train.horovod.fusion_threshold_mb"] == "64"      # Horovod reads it
    assert params["env"] == "{}"
    assert params["train.tracking.mlflow.uri"] == rec["uri"]        # resolved, not null
    assert params["train.tracking.mlflow.experiment"] == "s"
    assert (rec["state"], rec["status"], rec["attempt"]) == ("ended", "FINISHED", 0)
    tags = got.data.tags
    assert tags["hpcsuite.slurm_job_id"] == "4242" and tags["hpcsuite.attempt"] == "0"
    assert tags["hpcsuite.status"] == "completed" and "hpcsuite.sweep" not in tags
    history = sorted((m.step, m.value) for m in c.get_metric_history(rec["run_id"], "loss"))
    assert history == [(s, 1.0 / (s + 1)) for s in range(1, 10)]
    assert c.get_metric_history(rec["run_id"], "throughput/samples_per_s")
    assert [f.path for f in c.list_artifacts(rec["run_id"])] == ["results.json"]


def test_a_second_attempt_continues_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    first, run_dir = script_run(tmp_path)
    train(first)
    rec = record(run_dir)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second, _ = script_run(tmp_path)
    train(second, scale=2.0)
    again = record(run_dir)
    assert again["run_id"] == rec["run_id"] and again["uri"] == rec["uri"]   # the same MLflow run
    assert (rec["attempt"], again["attempt"], again["state"]) == (0, 1, "ended")
    c = client(rec["uri"])
    assert len(c.search_runs([rec["experiment_id"]])) == 1
    got = c.get_run(rec["run_id"])
    assert got.data.tags["hpcsuite.attempt"] == "1" and got.info.status == "FINISHED"
    values = sorted(m.value for m in c.get_metric_history(rec["run_id"], "loss"))
    assert len(values) == 18 and values[-1] == 1.0 and 2.0 / 2 in values


def test_a_server_out_of_reach_logs_to_the_run_directory(tmp_path, monkeypatch, caplog):
    run, run_dir = script_run(tmp_path, {"uri": f"http://127.0.0.1:{closed_port()}",
                                         "experiment": "offline"})
    with caplog.at_level(logging.WARNING):
        train(run)
    rec = record(run_dir)
    assert rec["uri"] == RunDir(run_dir).mlruns.absolute().as_uri()
    got = client(rec["uri"]).get_run(rec["run_id"])
    assert got.info.status == "FINISHED" and got.data.params["train.batch_size"] == "4"
    assert sum("not reachable" in r.getMessage() for r in caplog.records) == 1
    assert rec["asked"].startswith("http://127.0.0.1:") and "not reachable" in rec["fell_back"]
    line = mlflow_store.summary_line(run_dir)
    assert line.startswith(f"MLflow: run {rec['run_id']} (FINISHED), experiment 'offline'")
    assert f"fell back to {rec['uri']} ({rec['asked']}: server 127.0.0.1:" in line


def test_a_store_that_cannot_be_written_turns_tracking_off_in_one_line(tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    run, run_dir = script_run(tmp_path, {"uri": str(tmp_path / "file" / "mlruns")})
    with caplog.at_level(logging.WARNING):
        train(run)                                        # training still ends well
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"
    said = [r.getMessage() for r in caplog.records if "train.tracking" in r.getMessage()]
    assert len(said) == 1 and "no more MLflow logging" in said[0] and "\n" not in said[0]
    rec = record(run_dir)              # what `status` and `submit --wait` say
    assert rec["state"] == "lost" and "run_id" not in rec
    assert mlflow_store.summary_line(run_dir) == f"MLflow: lost in attempt 0: {rec['error']}"


def test_without_mlflow_installed_one_line_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)   # import mlflow.tracking fails
    run, run_dir = script_run(tmp_path)
    with caplog.at_level(logging.WARNING):
        train(run)
    said = [r.getMessage() for r in caplog.records if "train.tracking" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("train.tracking.mlflow: ModuleNotFoundError: ")
    assert said[0].endswith("(mlflow is not installed where the ranks run: pip install "
                            "'hpcsuite[tracking]'); no more MLflow logging this attempt")
    assert mlflow_store.summary_line(run_dir).startswith(
        "MLflow: lost in attempt 0: ModuleNotFoundError: ")


def test_report_adds_its_plots_to_the_run(tmp_path):
    run, run_dir = script_run(tmp_path)
    train(run)
    from hpcsuite.runs.report import plot

    plots = plot(run_dir)
    line = mlflow_store.add_plots(run_dir, plots)
    rec = record(run_dir)
    assert line.startswith(f"MLflow: {len(plots)} plots added to run {rec['run_id']}")
    names = {f.path for f in client(rec["uri"]).list_artifacts(rec["run_id"], "report")}
    assert names == {f"report/{p.name}" for p in plots}
    assert mlflow_store.add_plots(tmp_path, plots) is None       # a run without tracking


def test_a_studys_points_share_one_experiment_named_after_it(tmp_path):
    from hpcsuite.study import points as st
    from hpcsuite.submit.config import resolve

    study = st.Study(name="scal", base="job.yaml", axes={"nodes": [1, 2]})
    tracked = {"name": "b", "train": {"tracking": {"mlflow": {}}}}
    point = st.expand(study, spec_from_dict(tracked, "t"))[0]
    sets = st.point_sets(study, spec_from_dict(tracked, "t"), point, str(tmp_path / "runs"))
    assert 'train.tracking.mlflow.experiment="scal"' in sets
    (tmp_path / "job.yaml").write_text("name: b\ntrain:\n  tracking: {mlflow: {}}\n")
    job = resolve(str(tmp_path / "job.yaml"), None, sets, cwd=tmp_path, ambient=False).job
    assert job.train.tracking.mlflow.experiment == "scal" and job.name == point.job_name
    named = {"name": "b", "train": {"tracking": {"mlflow": {"experiment": "mine"}}}}
    assert not any("tracking" in s for s in st.point_sets(study, spec_from_dict(named, "t"),
                                                         point, "/x"))
    assert not any("tracking" in s for s in st.point_sets(study, spec_from_dict(
        {"name": "b"}, "t"), point, "/x"))


def slow_open(monkeypatch, seconds):
    """MLflow's run opens ``seconds`` late (mlflow's import on a loaded node)."""
    import time

    opened = tracking.MlflowRun.open.__func__

    def late(cls, job, paths):
        time.sleep(seconds)
        return opened(cls, job, paths)

    monkeypatch.setattr(tracking.MlflowRun, "open", classmethod(late))


def test_an_attempt_shorter_than_mlflows_import_still_has_its_run(tmp_path, monkeypatch):
    # the trial's sweep: 16 steps ended before mlflow was imported, and mlflow.json never came
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    monkeypatch.setattr(tracking, "FINISH_SECONDS", 0.2)
    slow_open(monkeypatch, 1.0)
    run, run_dir = script_run(tmp_path)
    train(run)                                       # finish() returns with the run ended
    rec = record(run_dir)
    assert (rec["state"], rec["status"]) == ("ended", "FINISHED")
    got = client(rec["uri"]).get_run(rec["run_id"])
    assert got.info.status == "FINISHED"
    assert len(client(rec["uri"]).get_metric_history(rec["run_id"], "loss")) == 9


def test_a_run_that_never_opens_is_recorded_lost_in_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracking, "OPEN_SECONDS", 0.3)
    slow_open(monkeypatch, 1.5)
    run, run_dir = script_run(tmp_path)
    with caplog.at_level(logging.WARNING):
        train(run)
    said = [r.getMessage() for r in caplog.records if "train.tracking" in r.getMessage()]
    assert len(said) == 1 and "was not open 0 s after the attempt's end" in said[0]
    rec = record(run_dir)
    assert rec["state"] == "lost" and "not open" in rec["error"]
    assert mlflow_store.summary_line(run_dir).startswith("MLflow: lost in attempt 0: Timeout")
    run.session.tracker.thread.join(10)            # the late open does not undo the loss
    assert record(run_dir)["state"] == "lost"


def test_points_of_one_key_get_distinct_times_so_a_database_keeps_each(tmp_path, monkeypatch):
    # The other ranks' utilisation is charted at the end, all at once: two samples at the last
    # step with the same memory were one point (step, time, value) that a sqlite or server
    # store keeps once, and `tracking sync` lost it (seen in tests/test_e2e_tracking.py).
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    run, run_dir = script_run(tmp_path)
    tracker = run.session.tracker
    for _ in range(3):
        tracker.add(7, 0, {"utilisation/rank1/memory_mib": 331.5, "other": 1.0})
    train(run)
    rec = record(run_dir)
    history = client(rec["uri"]).get_metric_history(rec["run_id"], "utilisation/rank1/memory_mib")
    stamps = [m.timestamp for m in history]
    assert len(history) == 3 and len(set(stamps)) == 3, stamps
