"""Stopping before Slurm's time limit, by the ranks' own clock.

Slurm's warning signal (``--signal``, :attr:`Preemption.lead_seconds`) comes at a fixed lead
chosen at submit time, before anyone knows how long this model's checkpoint takes to save.
Rank 0 therefore also asks Slurm once how much time the job has left, and at each vote
proposes to stop once the time left is about what a stop needs, measured: twice the longest
checkpoint save so far (before the first: an estimate from the model's size), two vote
intervals and two steps for the ranks to agree, and :data:`EXIT_SECONDS` to write the results
and leave. The ranks agree through the vote they already hold, so every rank
stops at the same step (:mod:`.session`).
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

EXIT_SECONDS = 10.0              # results, Horovod shutdown, the batch script's requeue
ESTIMATE_BYTES_PER_S = 50e6      # a slow shared filesystem, until a save has been measured


def parse_time_left(text: str) -> float | None:
    """squeue's %L ([days-]hours:minutes:seconds, leading fields dropped): seconds, or None
    for UNLIMITED / NOT_SET / anything else."""
    from ...submit.values import walltime_seconds

    text = text.strip()
    try:
        if ":" not in text:   # a bare number would be minutes to --time, never printed by %L
            return None
        return float(walltime_seconds(text))
    except ValueError:
        return None


class TimeLimit:
    def __init__(self, seconds_left: float | None, now: float | None = None):
        now = time.monotonic() if now is None else now
        self.end = None if seconds_left is None else now + seconds_left
        self.hit = False         # this rank proposed the stop for the time limit

    @classmethod
    def from_slurm(cls) -> "TimeLimit | None":
        from ...world import current

        job_id = current().job_id
        if not job_id:
            return None
        from ... import slurm
        from ...errors import UserError

        try:
            done = slurm.call(["squeue", "-h", "-j", job_id, "-o", "%L"], check=False, timeout=20,
                              env=dict(os.environ))
        except UserError as e:
            log.warning("no time limit watch: %s", e)
            return None
        left = parse_time_left(done.stdout) if done.returncode == 0 else None
        if left is None:
            if done.returncode != 0 or done.stdout.strip() not in ("UNLIMITED", "NOT_SET"):
                log.warning("no time limit watch: squeue said %r", (done.stdout + done.stderr).strip()[:100])
            return None
        return cls(left)

    def left(self, now: float | None = None) -> float | None:
        if self.end is None:
            return None
        return self.end - (time.monotonic() if now is None else now)

    @staticmethod
    def needed(save_seconds: list[float], state_bytes: int, step_seconds: float,
               vote_seconds: float) -> float:
        save = max(save_seconds) if save_seconds else 1.0 + state_bytes / ESTIMATE_BYTES_PER_S
        return 2 * save + 2 * vote_seconds + 2 * step_seconds + EXIT_SECONDS

    def near(self, save_seconds: list[float], state_bytes: int, step_seconds: float,
             vote_seconds: float, now: float | None = None) -> bool:
        left = self.left(now)
        if left is None:
            return False
        if left <= self.needed(save_seconds, state_bytes, step_seconds, vote_seconds):
            if not self.hit:
                log.info("stopping for the time limit: %.0f s left, a stop needs %.1f s", left,
                         self.needed(save_seconds, state_bytes, step_seconds, vote_seconds))
            self.hit = True
        return self.hit


def stop_reason(time_limit: "TimeLimit | None", signal_lead: int) -> str:
    """time_limit or preempted, from rank 0's view (it alone watches the clock): its own stop
    for the time limit, or a signal in the last minutes before it, which is Slurm's time-limit
    warning (Slurm may send it up to a minute early)."""
    if time_limit is not None:
        left = time_limit.left()
        if time_limit.hit or (left is not None and left < signal_lead + 90):
            return "time_limit"
    return "preempted"
