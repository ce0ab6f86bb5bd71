"""The runner (prepare, submit, wait, describe) without the CLI, Slurm faked at jobs.query."""

import json
from pathlib import Path

import pytest

from hpcsuite.runs import jobs
from hpcsuite.submit import knobs
from hpcsuite import runner
from hpcsuite.errors import JobFailed, JobInputFailed, JobPreempted, UserError
from hpcsuite.runs.rundir import RunDir

SBATCH = Path(__file__).resolve().parent.parent / "sbatch"
PROFILE = str(SBATCH / "profile.yaml")


def state(job_id="9", name="COMPLETED", exit_code="0:0", stdout=None, reason=None):
    return jobs.JobState(job_id, name, exit_code, stdout, None, reason, "0:10")


def test_prepare_returns_the_request_and_its_warnings_unprinted(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: w\nresources: {tasks_per_node: 2, gpus_per_node: 4,"
                                       " partition: gpu}\n")
    prepared = runner.prepare("job.yaml", PROFILE)
    assert prepared.site_profile is True
    assert [w.key for w in prepared.warnings] == ["resources.tasks_per_node"]
    assert prepared.request.spec == str(tmp_path / "job.yaml")
    assert "#SBATCH --job-name=w" in prepared.request.script
    assert capsys.readouterr() == ("", "")


def test_prepare_refuses_errors_one_line_each_with_the_findings_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("name: e\nresources: {partition: nosuch, time: '0'}\n")
    with pytest.raises(runner.LintFailed) as e:
        runner.prepare("job.yaml", PROFILE)
    assert {f.key for f in e.value.errors} == {"resources.partition", "resources.time"}
    assert str(e.value).count("\nerror: job.yaml: ") == 1
    assert e.value.exit_code == 2


def test_held_adds_hold_once():
    import dataclasses

    from hpcsuite.submit.plan import BatchRequest
    request = BatchRequest(job=None, script="", sbatch_argv=["sbatch", "--parsable"],
                           run_root="r", template="t")
    once = runner.held(request)
    assert once.sbatch_argv == ["sbatch", "--parsable", "--hold"]
    assert runner.held(once).sbatch_argv == once.sbatch_argv
    assert dataclasses.replace(request) == request


@pytest.mark.parametrize("end, results, exit_class, error", [
    (state(), None, runner.COMPLETED, None),
    (state(), {"status": "preempted", "final_step": 7}, runner.STOPPED, JobPreempted),
    (state(name="FAILED", exit_code="1:0"), None, runner.FAILED, JobFailed),
    (state(name="FAILED", exit_code="2:0"), None, runner.INPUT_ERROR, JobInputFailed),
])
def test_wait_classifies_the_end(tmp_path, monkeypatch, end, results, exit_class, error):
    run_dir = tmp_path / "job" / "9"
    run_dir.mkdir(parents=True)
    log = RunDir(run_dir).slurm_log("9")
    log.write_text("starting\nerror: data.yaml: train.data.path: no such file\n")
    if results:
        (RunDir(run_dir).results).write_text(json.dumps(results))
    seen = []
    monkeypatch.setattr(jobs, "query", lambda job_id: end)
    outcome = runner.wait("9", str(run_dir), on_progress=lambda r: seen.append(r.line()))
    assert outcome.exit_class == exit_class and outcome.exit_code == runner.EXIT_CODES[exit_class]
    assert seen == [f"{end.state} 0:10"]
    assert outcome.to_json()["state"] == end.state
    err = outcome.error()
    assert (err is None) if error is None else type(err) is error
    if exit_class == runner.INPUT_ERROR:
        assert str(err).startswith("job 9 ended FAILED: data.yaml: train.data.path: no such file")
    if exit_class == runner.FAILED:
        assert str(err).startswith(f"job 9 ended FAILED (exit 1:0); last lines of {log}:")


def test_a_failed_job_leads_with_what_its_ranks_reported(tmp_path, monkeypatch):
    """The launcher's own lines after a rank's failure can push it out of the log's last
    lines; the failure the first rank reported (FAILED-attempt-N) comes first."""
    run_dir = tmp_path / "job" / "9"
    run_dir.mkdir(parents=True)
    log = RunDir(run_dir).slurm_log("9")
    log.write_text("mpirun noise\n" * 40)
    RunDir(run_dir).failed(0).write_text(
        "rank 1\nranks stopped inside Horovod's init: no step within 20 s after they started "
        "(train.startup_timeout_seconds)\n")
    monkeypatch.setattr(jobs, "query", lambda job_id: state(name="FAILED", exit_code="1:0"))
    err = runner.wait("9", str(run_dir)).error()
    assert type(err) is JobFailed and str(err).startswith(
        "job 9 ended FAILED (exit 1:0): rank 1: ranks stopped inside Horovod's init: no step "
        "within 20 s "
        f"after they started (train.startup_timeout_seconds); last lines of {log}:\nmpirun noise")


def test_wait_turns_a_job_that_can_never_start_into_an_outcome(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "query", lambda job_id: state(name="PENDING", exit_code="",
                                                            reason="PartitionConfig"))
    outcome = runner.wait("9", str(tmp_path))
    assert outcome.exit_class == runner.NEVER_STARTS and outcome.exit_code == 2
    assert isinstance(outcome.error(), UserError)
    assert "can never start: PartitionConfig" in str(outcome.error())


def test_describe_is_one_record_for_text_json_and_runs(tmp_path, monkeypatch):
    from hpcsuite.runs import registry

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "d" / "5"
    run_dir.mkdir(parents=True)
    RunDir(run_dir).progress.write_text(json.dumps({"step": 3, "max_steps": 10}))
    registry.record(tmp_path, {"job_id": "5", "name": "d", "run_dir": str(run_dir)})
    monkeypatch.setattr(jobs, "query", lambda job_id: state("5", "RUNNING", ""))
    record = runner.describe("d")
    assert record.name == "d" and record.line() == "RUNNING 0:10 step 3/10"
    assert record.lines()[0] == "job 5 (d): RUNNING 0:10 step 3/10"
    data = record.to_json()
    assert data["state"] == "RUNNING" and data["progress"]["step"] == 3
    assert data["attempts"]["count"] == 0 and "results" not in data
    monkeypatch.setattr(jobs, "query_many", lambda ids: {"5": state("5", "RUNNING", "")})
    [row] = [r.row() for r in runner.describe_many(registry.load(tmp_path))]
    assert row["state"] == "RUNNING" and row["step"] == 3 and row["name"] == "d"


def test_one_table_of_horovod_knobs():
    from hpcsuite.submit.spec import HOROVOD_KNOBS, HorovodKnobs
    from hpcsuite.study.points import HOROVOD_AXES

    defaults = HorovodKnobs()
    assert {k.name for k in knobs.KNOBS} == set(HorovodKnobs.__dataclass_fields__)
    assert all(getattr(defaults, k.name) == k.default for k in knobs.KNOBS)
    assert HOROVOD_KNOBS["HOROVOD_CYCLE_TIME"] == "cycle_time_ms"
    assert HOROVOD_AXES == ("compression", "op", "fusion_threshold_mb", "cycle_time_ms",
                            "autotune")
    env = knobs.environment(defaults, {"timeline": "T", "autotune_log": "A"}, timeline_window=True)
    assert list(env) == ["HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME",
                         "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                         "HOROVOD_TIMELINE"]
    assert env["HOROVOD_TIMELINE"] == "DYNAMIC" and env["HOROVOD_FUSION_THRESHOLD"] == str(64 << 20)
    assert set(env) <= set(HOROVOD_KNOBS)


def test_one_allreduce_job_builder_for_bench_and_studies(tmp_path):
    from hpcsuite.study.allreduce_job import job_spec
    from hpcsuite.submit.spec import load_spec

    bench = job_spec([4, 1024], 2, 1, "out", "00:03:00", None, 0.25)
    assert bench["train"]["args"] == ["--sizes", "4,1024", "--budget", "0.25"]
    base = load_spec(str(SBATCH / "mpirun-2node.yaml"))
    point = job_spec(None, 2, 1, "runs", budget_s=None, name="s-a00", base=base)
    assert point["name"] == "s-a00" and "args" not in point["train"]
    assert point["train"]["script"] == bench["train"]["script"]
    assert point["resources"]["time"] == base.resources.time
    assert point["launcher"] == base.launcher
    assert bench["train"]["checkpoint"] == point["train"]["checkpoint"] == {
        "every_steps": 0, "every_minutes": 0, "resume": False}


@pytest.mark.parametrize("marker, headline", [
    # the rank's FAILED marker says what failed, whatever other `error: ` lines the log has
    ("rank 0\nexit 2\nhpcsuite train: rank 0 on node1 failed in train.model:\n"
     "error: unknown model 'nosuchmodel'\n", "unknown model 'nosuchmodel'"),
    # no rank reported (the batch script's own hpcsuite command failed before any rank ran):
    # the last `error: ` line, the one that ended the script
    (None, "ckpt: job 7 writes checkpoints there (train.checkpoint.dir)"),
])
def test_an_input_error_leads_with_the_failed_marker_not_the_logs_first_error_line(
        tmp_path, monkeypatch, marker, headline):
    """An input error (exit 2) reads the FAILED marker as a failure does: the log's first
    `error: ` line may be anyone's (the site's setup, a module system, srun)."""
    run_dir = tmp_path / "job" / "9"
    run_dir.mkdir(parents=True)
    log = RunDir(run_dir).slurm_log("9")
    log.write_text("error: module cuda/12.4 is not available here (ignored)\n"
                   "srun: error: node1: task 0: Exited with exit code 2\n"
                   + ("error: ckpt: job 7 writes checkpoints there (train.checkpoint.dir)\n"
                      if marker is None else ""))
    if marker is not None:
        RunDir(run_dir).failed(0).write_text(marker)
    monkeypatch.setattr(jobs, "query", lambda job_id: state(name="FAILED", exit_code="2:0"))
    err = runner.wait("9", str(run_dir)).error()
    assert type(err) is JobInputFailed and err.exit_code == 2
    assert str(err).startswith(f"job 9 ended FAILED: {headline}\nlast lines of {log}:"), str(err)


def test_a_signal_that_killed_the_batch_script_is_named():
    from hpcsuite.runner.status import exit_words

    assert exit_words("0:10") == "exit 0:10 (the batch script was killed by SIGUSR1)"
    assert exit_words("0:9") == "exit 0:9 (the batch script was killed by SIGKILL)"
    assert exit_words("1:0") == "exit 1:0" and exit_words("2:0") == "exit 2:0"
