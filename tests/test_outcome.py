"""`hpcsuite runs`' OUTCOME: a job's own record of its attempts, not Slurm's state alone."""

from hpcsuite.runner.status import run_outcome
from hpcsuite.runs.outcome import outcome


def rec(attempt, what, **more):
    return {"attempt": attempt, "outcome": what, **more}


def test_no_record_is_no_outcome():
    assert outcome([]) is None


def test_a_completed_job_says_how_many_attempts_it_took():
    assert outcome([rec(0, "completed", exit=0)]) == "completed"
    assert outcome([rec(0, "preempted", requeued=True), rec(1, "failed", exit=1, requeued=True),
                    rec(2, "completed")]) == "completed after 3 attempts (1 preempted, 1 failed)"


def test_a_stop_says_whether_it_was_requeued():
    assert outcome([rec(0, "preempted", step=40, requeued=True)]) == \
        "preempted at attempt 0, requeued"
    assert outcome([rec(0, "time_limit", requeued=False)]) == \
        "stopped before the time limit at attempt 0"
    assert outcome([rec(0, "stopped")]) == "stopped without a checkpoint at attempt 0"


def test_a_failure_names_its_attempt_and_exit():
    records = [rec(0, "failed", exit=1, requeued=True), rec(1, "failed", exit=1, requeued=False)]
    assert outcome(records) == "failed at attempt 1 (exit 1)"
    assert outcome(records[:1]) == "failed at attempt 0 (exit 1), requeued"
    assert outcome([rec(0, "lost", why="a node failed")]) == "lost at attempt 0 (a node failed)"
    assert outcome([rec(2, "not_started", why="failure budget spent (2 > 1)")]) == \
        "not started at attempt 2 (failure budget spent (2 > 1))"


def test_a_runs_listing_reads_the_run_directory_and_survives_damage(tmp_path):
    assert run_outcome(tmp_path) is None
    (tmp_path / "attempts.jsonl").write_text('{"attempt": 0, "outcome": "preempted", '
                                             '"requeued": true}\n{"attempt": 1, "outcome": '
                                             '"completed"}\n')
    assert run_outcome(tmp_path) == "completed after 2 attempts (1 preempted)"
    (tmp_path / "attempts.jsonl").write_text("not json\n")
    assert run_outcome(tmp_path).startswith("attempt records damaged")
