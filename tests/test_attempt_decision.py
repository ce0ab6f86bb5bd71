"""The end-of-attempt decision (hpcsuite.runs.attempts.decide) as a table: from what is known
when an attempt ends to whether hpcsuite requeues the job, what it says and what it records.
No files, no Slurm: test_attempts.py runs the same through `attempt end`, test_e2e_reliability.py
through real Slurm."""

import dataclasses

import pytest

from hpcsuite.runs.attempts import Ending, decide

BASE = Ending(attempt=1, status=0, outcome="completed", step=None, stop=None, signal=None,
              saved_at=None, marker_seen=False, failures=0, own_signal="USR1", requeue_on=True,
              max_failures=1, script=False)


def ending(**facts):
    return dataclasses.replace(BASE, **facts)


# (the facts that differ from BASE, requeued, a word of what it says (None: silent), the record's
# extra fields)
TABLE = [
    ({}, False, None, {}),
    # a signal it never stopped on: said, and recorded
    ({"signal": "USR1"}, False, "got SIGUSR1 and ran on to its end without stopping",
     {"signal": "USR1"}),
    ({"signal": "USR1", "script": True}, False, "does not call run.should_stop()",
     {"signal": "USR1"}),
    # saved on the job's own warning signal: requeued (train.preemption.requeue), else told how
    ({"outcome": "preempted", "step": 40, "stop": "USR1", "marker_seen": True}, True, None,
     {"signal": "USR1"}),
    ({"outcome": "preempted", "step": 40}, True, None, {}),
    ({"outcome": "time_limit", "step": 90, "requeue_on": False}, False,
     "stopped before the time limit after saving a checkpoint at step 90; not requeued", {}),
    # Slurm's own TERM (a requeue, a cancel): recorded, Slurm decides
    ({"outcome": "preempted", "step": 40, "stop": "TERM", "marker_seen": True}, False,
     "preempted on SIGTERM from Slurm", {"signal": "TERM"}),
    # Open MPI 5's prterun holds the TERM: the ranks save and exit 0; still Slurm's stop
    ({"outcome": "preempted", "status": 0, "step": 40, "stop": "TERM", "marker_seen": True},
     False, "preempted on SIGTERM from Slurm", {"signal": "TERM"}),
    ({"outcome": "failed", "status": 1, "stop": "TERM", "failures": 1}, False,
     "ended on SIGTERM from Slurm before saving", {}),
    # a stop with no checkpoint at its step: requeued only with one to resume from
    ({"outcome": "stopped", "step": 13, "signal": "USR1", "saved_at": 10}, True,
     "its work since the checkpoint at step 10 is lost", {"checkpoint_step": 10, "signal": "USR1"}),
    ({"outcome": "stopped", "step": 13, "signal": "USR1"}, False, "no checkpoint exists",
     {"checkpoint_step": None, "signal": "USR1"}),
    ({"outcome": "stopped", "step": 13, "stop": "TERM", "signal": "TERM", "saved_at": 10}, False,
     "stopped on SIGTERM at step 13", {"checkpoint_step": 10, "signal": "TERM"}),
    # failures: within the budget requeued, beyond it not, exit 2 never
    ({"outcome": "failed", "status": 1, "failures": 1}, True, None, {}),
    ({"outcome": "failed", "status": 1, "failures": 2}, False,
     "not requeued: 2 failed attempts, more than train.preemption.max_failures (1)", {}),
    ({"outcome": "failed", "status": 1, "failures": 1, "max_failures": 0}, False, None, {}),
    ({"outcome": "failed", "status": 2, "failures": 1, "max_failures": 5}, False,
     "not requeued, it would fail the same way", {}),
]


@pytest.mark.parametrize("facts, requeued, says, extra", TABLE)
def test_the_end_of_an_attempt_decides_from_its_facts_alone(facts, requeued, says, extra):
    d = decide(ending(**facts))
    assert d.requeue == requeued
    assert (d.why is not None) == requeued
    if says is None:
        assert d.said == ()
    else:
        assert len(d.said) == 1 and says in d.said[0], d.said
    assert d.extra == extra


def test_a_requeue_says_why():
    assert decide(ending(outcome="failed", status=1, failures=1)).why == (
        "attempt 1 failed (exit 1); failure 1 of at most 1 (train.preemption.max_failures)")
    assert decide(ending(outcome="preempted", step=40)).why == \
        "attempt 1 preempted after saving a checkpoint at step 40"
