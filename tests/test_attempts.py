"""The attempt records and restart decisions the batch script asks for (hpcsuite.runs.attempts).

Slurm's side (scontrol requeue, squeue, sacct) is replaced by a recorder here; the same paths
run for real in test_e2e_reliability.py."""

import json

import pytest

from hpcsuite.runs import attempts, ownership
from hpcsuite import slurm
from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results, attempt_summaries
from hpcsuite.submit.spec import spec_from_dict


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake(argv, **kw):
        seen.append(argv)
        out = ""
        if argv[0] == "squeue":
            out = seen_state.get(argv[3], "")
        return slurm.Completed(list(argv), 0, out, "")

    seen_state: dict[str, str] = {}
    monkeypatch.setattr(slurm, "call", fake)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    return seen, seen_state


def job(**pre):
    return spec_from_dict({"name": "a", "train": {"checkpoint": {"every_steps": 5},
                                                   "preemption": pre}}, "t")


def end(run_dir, j, status, attempt, monkeypatch, marker=None):
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(attempt))
    if marker:
        (run_dir / attempts.PREEMPTED_MARKER).write_text(marker)
    lines = []
    code = attempts.end(run_dir, j, status, out=lines.append)
    return code, lines


def test_preemptions_requeue_without_limit_failures_up_to_the_budget(tmp_path, calls, monkeypatch):
    seen, _ = calls
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = job(requeue=True, max_failures=1)
    for k in range(5):                                      # five preemptions: five requeues
        code, lines = end(run, j, 0, k, monkeypatch, marker=f"{10 * (k + 1)} signal\n")
        assert code == 0 and "requeueing job 42" in lines[-1]
    code, lines = end(run, j, 0, 5, monkeypatch, marker="60 time_limit\n")
    assert "stopped before the time limit after saving a checkpoint at step 60" in lines[-1]
    code, lines = end(run, j, 1, 6, monkeypatch)            # the first failure: requeued
    assert code == 1 and "failure 1 of at most 1" in lines[-1]
    code, lines = end(run, j, 1, 7, monkeypatch)            # the second: budget spent
    assert "not requeued: 2 failed attempts" in lines[-1]
    assert sum(argv[:2] == ["scontrol", "requeue"] for argv in seen) == 7
    c = attempts.counts(attempts.read_records(run))
    assert (c.attempts, c.preempted, c.failed, c.completed) == (8, 6, 2, 0)
    # An input error (exit 2) is never retried, whatever the budget.
    code, lines = end(run, job(max_failures=5), 2, 8, monkeypatch)
    assert code == 2 and "not requeued, it would fail the same way" in lines[-1]


def test_a_rank_that_failed_on_input_is_exit_2_when_srun_killed_the_others(tmp_path, calls,
                                                                          monkeypatch):
    """srun returns its tasks' highest status: 143 when rank 0 exited 2 (a preflight's or the
    job's input error) and srun then TERMed rank 1. Seen in CI: the attempt was requeued."""
    from hpcsuite.runs.rundir import RunDir, failure_text

    seen, _ = calls
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = job(max_failures=2)
    RunDir(run).failed(0).write_text(failure_text(0, 2, "error: preflight.fabric: too slow"))
    code, lines = end(run, j, 143, 0, monkeypatch)
    assert code == 2 and "failed (exit 2: the error hpcsuite reported above); not requeued" \
        in lines[-1]
    assert attempts.read_records(run)[-1]["exit"] == 2 and not seen
    RunDir(run).failed(1).write_text(failure_text(1, 1, "Traceback ...\nValueError: x"))
    code, lines = end(run, j, 143, 1, monkeypatch)           # a crash: retried as before,
    assert code == 1 and "failure 2 of at most 2" in lines[-1]       # with its rank's status
    code, lines = end(run, j, 137, 2, monkeypatch)           # no marker: as before
    assert code == 137 and "(exit 137); not requeued: 3 failed attempts" in lines[-1]


def test_begin_counts_attempts_that_left_no_record_and_stops_at_the_budget(tmp_path, calls, monkeypatch):
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")          # attempt 0 died with its node
    lines = []
    assert attempts.begin(run, job(max_failures=1), out=lines.append) == 0
    assert attempts.read_records(run)[0]["outcome"] == "lost"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")          # and attempt 1 too: over budget
    assert attempts.begin(run, job(max_failures=1), out=lines.append) == 1
    assert "not starting attempt 2: 2 failed attempt(s)" in lines[-1]


def test_a_live_job_owning_the_checkpoint_directory_refuses_another(tmp_path, calls, monkeypatch):
    _, states = calls
    root = tmp_path / "ck"
    ownership.claim(root, "41", tmp_path / "runs" / "41")
    states["41"] = "RUNNING"
    with pytest.raises(UserError, match=r"ck: checkpoint directory in use by job 41 \(RUNNING"):
        ownership.claim(root, "42", tmp_path / "runs" / "42")
    ownership.claim(root, "41", tmp_path / "runs" / "41")    # its own requeued attempt: fine
    states.clear()                                          # job 41 is gone: 42 takes over
    ownership.claim(root, "42", tmp_path / "runs" / "42")
    assert ownership.read_owner(root)["job_id"] == "42"
    ownership.release(root, "42")
    assert ownership.read_owner(root) is None


def test_damaged_attempt_records_name_the_file_and_line(tmp_path):
    (tmp_path / attempts.RECORDS).write_text('{"attempt": 0, "outcome": "failed"}\n{"attempt": 1, "outc')
    with pytest.raises(UserError, match=r"attempts.jsonl:2: not valid JSON"):
        attempts.read_records(tmp_path)
    (tmp_path / attempts.RECORDS).write_text('[1, 2]\n')
    with pytest.raises(UserError, match=r"attempts.jsonl:1: not an attempt record"):
        attempts.read_records(tmp_path)


def test_each_attempt_keeps_its_results_and_results_json_sums_them_up(tmp_path):
    for k, (start, final, status) in enumerate([(0, 40, "preempted"), (40, 90, "time_limit"),
                                                (90, 120, "completed")]):
        Results(job="a", attempt=k, status=status, start_step=start, final_step=final,
                steps=final - start).write(tmp_path)
    whole = Results.load(tmp_path / "results.json")
    assert [(a["attempt"], a["status"], a["final_step"]) for a in whole.attempts] == \
        [(0, "preempted", 40), (1, "time_limit", 90), (2, "completed", 120)]
    assert Results.load(tmp_path / "results-attempt-0.json").final_step == 40
    (tmp_path / "results-attempt-1.json").write_text('{"job": "a", "final_st')
    with pytest.raises(UserError, match=r"results-attempt-1.json:1: not valid JSON"):
        attempt_summaries(tmp_path)
    Results(job="a", attempt=3, final_step=130).write(tmp_path)   # in the job: noted, not fatal
    assert json.loads((tmp_path / "results.json").read_text())["attempts"][1]["status"] == "damaged"


def test_submit_refuses_a_finished_checkpoint_and_mixing_with_an_earlier_run(tmp_path, calls):
    root = tmp_path / "runs" / "a" / "checkpoints" / "step-00000020"
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"step": 20, "epoch": 1}))
    (root / "COMMITTED").write_text("x\n")
    finished = spec_from_dict({"name": "a", "train": {"epochs": 1, "checkpoint": {"every_steps": 5}}}, "t")
    with pytest.raises(UserError, match=r"runs/a/checkpoints/step-00000020: already holds a "
                                        r"finished run of a \(step 20, train.epochs 1 reached\)"):
        ownership.check_before_submit(finished, tmp_path)
    more = spec_from_dict({"name": "a", "train": {"epochs": 2, "checkpoint": {"every_steps": 5}}}, "t")
    ownership.check_before_submit(more, tmp_path)            # more epochs: it resumes
    fresh = spec_from_dict({"name": "a", "train": {"epochs": 2, "checkpoint": {
        "every_steps": 5, "resume": False}}}, "t")
    with pytest.raises(UserError, match="holds checkpoints of an earlier run"):
        ownership.check_before_submit(fresh, tmp_path)


def test_slurm_ending_the_job_after_the_ranks_saved_is_a_preemption_not_a_failure(
        tmp_path, calls, monkeypatch):
    """scontrol requeue (or PreemptMode=REQUEUE) sends SIGTERM to every process of the job:
    mpirun exits 1 while the ranks save. The batch shell recorded the TERM; rank 0's marker
    says where they saved. The attempt is preempted (not a failure), and hpcsuite leaves the
    requeue to Slurm (a cancel must stay cancelled)."""
    from hpcsuite.runs.rundir import RunDir

    seen, _ = calls
    monkeypatch.setattr(attempts, "STOP_WAIT_S", 0.0)
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = job(requeue=True, max_failures=0)
    RunDir(run).stop_requested(0).write_text("TERM\n")
    code, lines = end(run, j, 1, 0, monkeypatch, marker="2882 signal\n")
    assert "attempt 0 preempted on SIGTERM from Slurm" in lines[-1] and "step 2882" in lines[-1]
    assert not any(argv[:2] == ["scontrol", "requeue"] for argv in seen)
    record = attempts.read_records(run)[-1]
    assert (record["outcome"], record["step"], record["exit"], record["signal"]) == \
        ("preempted", 2882, 1, "TERM")
    # The next attempt starts: the failure budget (0) is untouched.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert attempts.begin(run, j, out=lines.append) == 0
    assert not RunDir(run).preempted.exists()     # attempt 0's marker is not attempt 1's
    c = attempts.counts(attempts.read_records(run))
    assert (c.preempted, c.failed) == (1, 0)
    # The job's own signal, the launcher failing after the ranks saved: requeued as usual.
    RunDir(run).stop_requested(1).write_text("USR1\n")
    code, lines = end(run, j, 1, 1, monkeypatch, marker="3000 signal\n")
    assert "requeueing job 42" in lines[-1]
    # Slurm's TERM and no marker: Slurm killed the ranks before rank 0 saved (mpirun took the
    # TERM too; KillWait ran out). Still Slurm's stop, not a failure: its work is the newest
    # checkpoint's, and the budget (0) stays untouched, so Slurm's requeue of it runs.
    RunDir(run).stop_requested(2).write_text("TERM\n")
    code, lines = end(run, j, 1, 2, monkeypatch)
    assert "before it could save; it has no checkpoint" in lines[-1]
    assert attempts.read_records(run)[-1]["outcome"] == "preempted"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert attempts.begin(run, j, out=lines.append) == 0
    # The job's own signal and no marker: the ranks were asked to save and did not.
    RunDir(run).stop_requested(3).write_text("USR1\n")
    code, lines = end(run, j, 1, 3, monkeypatch)
    assert attempts.read_records(run)[-1]["outcome"] == "failed"
    # A failed launcher with no stop signal: a stale marker is not read as a preemption.
    code, lines = end(run, j, 1, 4, monkeypatch, marker="10 signal\n")
    assert attempts.read_records(run)[-1]["outcome"] == "failed"


def test_slurm_killing_the_ranks_before_they_saved_resumes_from_the_newest_checkpoint(
        tmp_path, calls, monkeypatch):
    """Seen in CI: scontrol requeue, and mpirun ended the ranks before rank 0's save. The
    attempt is recorded preempted at the newest checkpoint's step, and with max_failures 0
    the requeued attempt still starts."""
    from hpcsuite.runs.rundir import RunDir

    monkeypatch.setattr(attempts, "STOP_WAIT_S", 0.0)
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = job(requeue=True, max_failures=0)
    root = attempts.checkpoint_root(j, run)
    for step, committed in ((1000, True), (1025, False)):    # 1025: a save cut short
        d = root / f"step-{step:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"step": step}))
        if committed:
            (d / "COMMITTED").write_text("")
    RunDir(run).stop_requested(0).write_text("TERM\n")
    code, lines = end(run, j, 1, 0, monkeypatch)
    assert "before it could save; its work is the checkpoint at step 1000" in lines[-1]
    record = attempts.read_records(run)[-1]
    assert (record["outcome"], record["step"], record["signal"]) == ("preempted", 1000, "TERM")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert attempts.begin(run, j, out=lines.append) == 0


def test_an_attempt_slurm_requeued_before_it_left_a_record_is_a_preemption(tmp_path, calls,
                                                                            monkeypatch):
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    monkeypatch.setattr(attempts, "_earlier_states", lambda job_id: ["REQUEUED"])
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert attempts.begin(run, job(max_failures=0), out=[].append) == 0
    first = attempts.read_records(run)[0]
    assert (first["outcome"], first["why"]) == ("preempted", "requeued by Slurm")


def test_a_cancel_before_any_save_is_not_undone_by_a_requeue(tmp_path, calls, monkeypatch):
    """scancel sends SIGTERM to every process; ranks that had saved nothing fail. With failures
    to spare hpcsuite used to requeue that attempt, running a job the user had cancelled."""
    from hpcsuite.runs.rundir import RunDir

    seen, _ = calls
    monkeypatch.setattr(attempts, "STOP_WAIT_S", 0.0)
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = job(requeue=True, max_failures=3)
    RunDir(run).stop_requested(0).write_text("TERM\n")
    code, lines = end(run, j, 143, 0, monkeypatch)
    assert "before it could save" in lines[-1] and "Slurm decides" in lines[-1]
    assert not any(argv[:2] == ["scontrol", "requeue"] for argv in seen)
    assert attempts.read_records(run)[-1]["outcome"] == "preempted"
    # the same failure with no signal from Slurm is still retried within the budget
    code, lines = end(run, j, 1, 1, monkeypatch)
    assert "requeueing job 42" in lines[-1]


def test_a_stop_without_a_checkpoint_is_recorded_as_stopped_never_as_saved(tmp_path, calls,
                                                                           monkeypatch):
    seen, _ = calls
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    j = spec_from_dict({"name": "a", "train": {"preemption": {"lead_seconds": 60}}}, "t")
    from hpcsuite.runs.rundir import RunDir

    RunDir(run).stop_requested(0).parent.mkdir(parents=True, exist_ok=True)
    RunDir(run).stop_requested(0).write_text("USR1\n")
    code, lines = end(run, j, 0, 0, monkeypatch, marker="1312 unsaved\n")
    assert code == 0
    assert lines == ["hpcsuite: attempt 0 stopped on SIGUSR1 at step 1312 without saving a "
                     "checkpoint; no checkpoint exists (train.checkpoint is off): its training "
                     "is lost"]
    [record] = attempts.read_records(run)
    assert (record["outcome"], record["step"], record["signal"], record["checkpoint_step"],
            record["requeued"]) == ("stopped", 1312, "USR1", None, False)
    assert not any(argv[:2] == ["scontrol", "requeue"] for argv in seen)
    c = attempts.counts(attempts.read_records(run))
    assert (c.preempted, c.failed) == (0, 0)


def test_a_signal_a_script_ran_through_is_said(tmp_path, calls, monkeypatch):
    run = tmp_path / "runs" / "a" / "42"
    run.mkdir(parents=True)
    from hpcsuite.runs.rundir import RunDir

    RunDir(run).stop_requested(0).parent.mkdir(parents=True, exist_ok=True)
    RunDir(run).stop_requested(0).write_text("USR1\n")
    j = spec_from_dict({"name": "a", "train": {"script": "t.py",
                                               "preemption": {"lead_seconds": 60}}}, "t")
    code, lines = end(run, j, 0, 0, monkeypatch)
    assert code == 0 and "got SIGUSR1 and ran on to its end" in lines[0]
    assert "run.should_stop()" in lines[0]
    [record] = attempts.read_records(run)
    assert (record["outcome"], record["signal"]) == ("completed", "USR1")


def test_a_cancel_under_open_mpi_5_stays_a_cancel(tmp_path, calls, monkeypatch):
    """Issue 51, point 7: prterun holds SIGTERM, so on a scancel the ranks save and exit 0:
    status 0 with rank 0's marker and the batch shell's TERM is Slurm's stop, not a
    preemption to requeue (nor one to "submit again to resume")."""
    from hpcsuite.runs.rundir import RunDir

    seen, _ = calls
    run = tmp_path / "runs" / "a" / "42"
    RunDir(run).stop_requested(0).parent.mkdir(parents=True)
    j = job(requeue=True, max_failures=2)
    RunDir(run).stop_requested(0).write_text("TERM\n")
    code, lines = end(run, j, 0, 0, monkeypatch, marker="120 signal\n")
    assert code == 0 and "preempted on SIGTERM from Slurm" in lines[-1], lines
    assert "Slurm decides" in lines[-1] and "submit the same spec again" not in " ".join(lines)
    assert not any(argv[:2] == ["scontrol", "requeue"] for argv in seen)
    record = attempts.read_records(run)[-1]
    assert (record["outcome"], record["step"], record["signal"], record["requeued"]) == \
        ("preempted", 120, "TERM", False)
    # the job's own warning signal under the same launcher: requeued as before
    RunDir(run).stop_requested(1).write_text("USR1\n")
    code, lines = end(run, j, 0, 1, monkeypatch, marker="150 signal\n")
    assert "requeueing job 42" in lines[-1]
    assert attempts.read_records(run)[-1]["requeued"] is True


def test_requeued_is_recorded_from_what_slurm_answered(tmp_path, monkeypatch):
    from hpcsuite import slurm

    monkeypatch.setattr(slurm, "call", lambda argv, **kw: slurm.Completed(
        list(argv), 1, "", "scontrol: error: Job has already finished"))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    run = tmp_path / "run"
    run.mkdir()
    code, lines = end(run, job(requeue=True), 0, 0, monkeypatch, marker="30 signal\n")
    assert "scontrol requeue 42 failed: scontrol: error: Job has already finished" in lines[-1]
    assert attempts.read_records(run)[-1]["requeued"] is False


def test_each_attempt_records_the_step_it_reached(tmp_path, calls, monkeypatch):
    """Issue 51, point 16: a failed attempt at step 130 and a completed one at 500 were
    recorded with "step": null."""
    from hpcsuite.runs.results import write_json_atomic
    from hpcsuite.runs.rundir import RunDir

    run = tmp_path / "run"
    run.mkdir()
    j = job(max_failures=1)
    write_json_atomic(RunDir(run).progress, {"step": 130})
    end(run, j, 1, 0, monkeypatch)
    assert attempts.read_records(run)[-1]["step"] == 130
    write_json_atomic(RunDir(run).attempt_results(1), {"final_step": 500})
    end(run, j, 0, 1, monkeypatch)
    assert [r["step"] for r in attempts.read_records(run)] == [130, 500]
