"""cancel tells the truth, and an array element cancelled before it ran is NEVER RAN in
`status`, `runs` and `sweep status` alike (Slurm faked at slurm.call)."""

import pytest

from hpcsuite import slurm
from hpcsuite.errors import UserError
from hpcsuite.runner.status import describe_many
from hpcsuite.runs import jobs


def fake_slurm(monkeypatch, squeue: str, scontrol: str, scancel_rc: int = 0, calls=None):
    """squeue's and scontrol's answers ("" with exit 1: the id is unknown)."""
    calls = [] if calls is None else calls

    def fake(argv, **kw):
        calls.append(argv)
        if argv[0] == "squeue":
            return slurm.Completed(argv, 0, squeue, "") if squeue is not None else \
                slurm.Completed(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        if argv[:3] == ["scontrol", "show", "job"]:
            return slurm.Completed(argv, 0, scontrol, "") if scontrol else \
                slurm.Completed(argv, 1, f"Job {argv[-1]} not found\n", "")  # stdout, as 22.05
        if argv[0] == "scancel":
            return slurm.Completed(argv, scancel_rc, "", "")
        if argv[0] == "sacct":
            return slurm.Completed(argv, 1, "", "sacct: error: accounting storage is disabled")
        return slurm.Completed(argv, 0, "JobCompLoc = (null)\n", "")
    monkeypatch.setattr(slurm, "call", fake)
    return calls


def test_cancel_of_a_running_job_cancels_it_and_says_so(monkeypatch):
    calls = fake_slurm(monkeypatch, "12|RUNNING\n", "JobId=12 JobState=RUNNING")
    assert jobs.cancel("12") == "cancelled 12 (it was RUNNING)"
    assert ["scancel", "12"] in calls


def test_cancel_of_an_array_names_what_it_cancelled(monkeypatch):
    fake_slurm(monkeypatch, "13_0|COMPLETED\n13_1|RUNNING\n13_2|PENDING\n13_3|PENDING\n", "")
    assert jobs.cancel("13") == "cancelled 13: 3 element(s), 2 PENDING, 1 RUNNING"


@pytest.mark.parametrize("state, said", [
    ("COMPLETED", "job 12 has already ended (COMPLETED, exit 0:0): nothing to cancel"),
    ("FAILED", "job 12 has already ended (FAILED, exit 0:0): nothing to cancel"),
    ("CANCELLED", "job 12 was already cancelled: nothing to cancel"),
])
def test_cancel_of_an_ended_job_cancels_nothing_and_exits_2(monkeypatch, state, said):
    calls = fake_slurm(monkeypatch, f"12|{state}\n",
                       f"JobId=12 JobState={state} ExitCode=0:0")
    with pytest.raises(jobs.NothingToCancel) as e:
        jobs.cancel("12")
    assert str(e.value) == said and e.value.exit_code == 2
    assert not any(c[0] == "scancel" for c in calls)


def test_cancel_of_an_unknown_id_says_slurm_does_not_know_it(monkeypatch):
    calls = fake_slurm(monkeypatch, None, "")
    with pytest.raises(jobs.NothingToCancel, match="job 999 is not known to Slurm: nothing to "
                                                   "cancel"):
        jobs.cancel("999")
    with pytest.raises(jobs.NothingToCancel, match="element of a job array cancelled before"):
        jobs.cancel("13_5")
    assert not any(c[0] == "scancel" for c in calls)


def test_a_job_ending_as_it_is_cancelled_is_not_reported_cancelled(monkeypatch):
    answers = iter(["12|RUNNING\n", "12|COMPLETED\n"])

    def fake(argv, **kw):
        if argv[0] == "squeue":
            return slurm.Completed(argv, 0, next(answers), "")
        if argv[0] == "scancel":
            return slurm.Completed(argv, 1, "", "scancel: error: Job/step already completing")
        if argv[0] == "scontrol":
            return slurm.Completed(argv, 0, "JobId=12 JobState=COMPLETED ExitCode=0:0", "")
        return slurm.Completed(argv, 1, "", "disabled")
    monkeypatch.setattr(slurm, "call", fake)
    with pytest.raises(jobs.NothingToCancel, match=r"already ended \(COMPLETED"):
        jobs.cancel("12")


def test_an_element_slurm_does_not_find_is_unknown_not_a_slurm_failure(monkeypatch):
    fake_slurm(monkeypatch, None, "")
    with pytest.raises(jobs.UnknownJob, match="job 13_5 is not known to Slurm"):
        jobs.query("13_5")


def test_an_element_cancelled_before_it_ran_is_never_ran_in_status_and_runs(monkeypatch, tmp_path):
    from hpcsuite.runner import describe
    from hpcsuite.runs import registry

    fake_slurm(monkeypatch, None, "")
    (tmp_path / "runs" / "s" / "13_0").mkdir(parents=True)
    registry.record(tmp_path, {"job_id": "13", "name": "s", "run_dir": str(tmp_path / "runs/s"),
                               "array": {"sweep": "s", "sweep_dir": "x", "indices": [0, 5]}})
    record = describe("13_5", tmp_path)
    assert record.state.state == jobs.NEVER_RAN
    assert record.lines()[0] == f"job 13_5 (s): NEVER RAN ({jobs.NEVER_RAN_WHY})"
    rows = [r.row() for r in describe_many(registry.expand(registry.load(tmp_path)),
                                           query=lambda ids: {})]
    assert [r["state"] for r in rows] == ["ARRAY", "UNKNOWN", jobs.NEVER_RAN]
    # a job Slurm forgot that did run (its run directory is there) is not called never-ran
    with pytest.raises(UserError, match="job 13_0 is not known to Slurm"):
        describe("13_0", tmp_path)


def test_the_sweep_footer_names_never_ran_as_status_does():
    from hpcsuite.sweep.status import tally

    rows = {0: {"done": True, "finished": True, "job_id": "1_0", "state": "COMPLETED"},
            1: {"done": False, "finished": True, "job_id": "1_1", "state": "FAILED"},
            2: {"done": False, "finished": True, "job_id": "1_2", "state": jobs.NEVER_RAN}}
    t = tally(rows)
    assert (t.failed, t.never_ran) == (1, 1)
    assert t.line() == "1/3 done, 0 in Slurm, 1 failed, 1 never ran (cancelled before it started)"


def _cli(*args):
    from click.testing import CliRunner

    from hpcsuite.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_cancel_command_exits_2_with_one_line_when_nothing_was_cancelled(monkeypatch):
    fake_slurm(monkeypatch, "12|COMPLETED\n", "JobId=12 JobState=COMPLETED ExitCode=0:0")
    result = _cli("cancel", "12")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: job 12 has already ended (COMPLETED, exit 0:0): nothing to cancel"]
    fake_slurm(monkeypatch, "12|PENDING\n", "JobId=12 JobState=PENDING")
    result = _cli("cancel", "12")
    assert (result.exit_code, result.output) == (0, "cancelled 12 (it was PENDING)\n")


def _run_with_job(tmp_path, monkeypatch, nodes=2, tasks=2):
    """A job 21 submitted from tmp_path (registry and run directory with its job.json)."""
    import json

    from hpcsuite.runs import registry
    from hpcsuite.submit.spec import spec_from_dict

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "four" / "21"
    (run_dir / "logs").mkdir(parents=True)
    job = spec_from_dict({"name": "four", "resources": {"nodes": nodes, "tasks_per_node": tasks}},
                         "job.yaml")
    (run_dir / "job.json").write_text(json.dumps(job.to_dict()))
    registry.record(tmp_path, {"job_id": "21", "name": "four", "run_dir": str(run_dir)})
    return run_dir


def test_logs_of_a_rank_the_job_does_not_have_says_so(monkeypatch, tmp_path):
    run_dir = _run_with_job(tmp_path, monkeypatch)
    (run_dir / "logs" / "rank-3.log").write_text("step 1\n")
    fake_slurm(monkeypatch, "21|RUNNING\n", f"JobId=21 JobState=RUNNING StdOut={run_dir}/o")
    result = _cli("logs", "four", "--rank", "7")
    assert result.exit_code == 2
    assert result.output == "error: job 21 has no rank 7: it runs 4 rank(s), 0 to 3\n"
    assert _cli("logs", "four", "--rank", "-1").exit_code == 2
    assert _cli("logs", "four", "--rank", "3").output == "step 1\n"


def test_logs_of_a_waiting_job_says_it_waits(monkeypatch, tmp_path):
    _run_with_job(tmp_path, monkeypatch)
    fake_slurm(monkeypatch, "21|PENDING\n", "JobId=21 JobState=PENDING Reason=Priority")
    result = _cli("logs", "four")
    assert result.exit_code == 2
    assert result.output == ("error: job 21 is waiting to start (Priority: other jobs come "
                             "first): no output yet\n")


def test_status_of_a_job_that_failed_on_a_reported_error_shows_it(monkeypatch, tmp_path):
    from hpcsuite.runner import describe

    run_dir = _run_with_job(tmp_path, monkeypatch)
    from hpcsuite.runs.rundir import failure_text
    (run_dir / "FAILED-attempt-0").write_text(failure_text(1, 2, "error: job.json: "
                                                           "train.data.path: /x.npy: no such file"))
    (run_dir / "FAILED-attempt-10").write_text("rank 3\nTraceback (most recent call last):\n"
                                               "  File \"m.py\", line 3\nValueError: bad shape\n")
    fake_slurm(monkeypatch, "21|FAILED\n", "JobId=21 JobState=FAILED ExitCode=1:0")
    record = describe("21", tmp_path)
    assert record.error == {"attempt": 10, "rank": 3, "message": "ValueError: bad shape",
                            "node": None, "at": None, "hint": None,
                            "frames": 'Traceback (most recent call last):\n  File "m.py", line 3\n'
                                      'ValueError: bad shape'}
    assert "  error (attempt 10, rank 3): ValueError: bad shape" in record.lines()
    (run_dir / "FAILED-attempt-10").unlink()
    assert "  error (attempt 0, rank 1): job.json: train.data.path: /x.npy: no such file" \
        in describe("21", tmp_path).lines()
    assert record.to_json()["error"]["rank"] == 3
