"""A job's outcome over its attempts, in a few words: what `hpcsuite runs` shows beside Slurm's
state, which says COMPLETED for a batch script that ended well whatever its ranks did, and
knows nothing of the attempts before a requeue. Read from the run directory's
``attempts.jsonl`` (:mod:`hpcsuite.runs.attempts`, which the batch script writes)."""

from __future__ import annotations

from .attempts import SAVED, counts

_STOPPED = {"preempted": "preempted", "time_limit": "stopped before the time limit",
            "stopped": "stopped without a checkpoint"}


def outcome(records: list[dict]) -> str | None:
    """The job's outcome from its attempt records (oldest first): "completed", "completed
    after 3 attempts (1 preempted, 1 failed)", "preempted at attempt 0, requeued", "failed at
    attempt 1", ...; None when no attempt has ended yet (or the job kept no record)."""
    if not records:
        return None
    last = records[-1]
    n, what = last["attempt"], last["outcome"]
    c = counts(records)
    if what == "completed":
        if c.attempts <= 1:
            return "completed"
        before = [f"{k} {word}" for k, word in ((c.preempted, "preempted"), (c.failed, "failed"))
                  if k]
        return f"completed after {c.attempts} attempts" + (f" ({', '.join(before)})"
                                                           if before else "")
    requeued = ", requeued" if last.get("requeued") else ""
    if what in SAVED or what in _STOPPED:
        return f"{_STOPPED.get(what, what)} at attempt {n}{requeued}"
    if what == "failed":
        return f"failed at attempt {n}" + (f" (exit {last['exit']})" if last.get("exit") else "") \
            + requeued
    if what == "not_started":
        return f"not started at attempt {n} ({last.get('why') or 'failure budget spent'})"
    return f"{what} at attempt {n}" + (f" ({last['why']})" if last.get("why") else "") + requeued
