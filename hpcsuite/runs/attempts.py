"""Attempts of one job: what each ended as, restart budgets, and who owns a checkpoint directory.

A job with requeue runs as attempts 0, 1, 2 ... under one job id and one run directory
(Slurm's ``SLURM_RESTART_COUNT``). The batch script calls ``hpcsuite attempt begin`` before it
launches the ranks and ``hpcsuite attempt end`` after, and this module keeps the record:

- ``attempts.jsonl`` in the run directory, one line per attempt: ``completed``, ``preempted``
  (a signal; Slurm's preemption, ``scancel --signal``, or Slurm's own requeue, whose
  SIGTERM makes mpirun exit 1 while the ranks save), ``time_limit`` (stopped before the
  walltime with a checkpoint), ``stopped`` (stopped on a signal or before the time limit with
  no checkpoint at its step), ``failed`` (the ranks failed), ``lost`` (the attempt left no
  record: a node failure, a kill; Slurm's accounting says which where it has it);
- the restart budget: preemptions and time limits requeue without limit (they saved their
  work), failures and lost attempts at most ``train.preemption.max_failures`` times, and a
  failure the spec or the user's input caused (exit 2) never, as it would fail again;
- ``OWNER.json`` in the checkpoint directory: the job writing there. A second job that would
  write into a directory a live job owns is refused (at submit, and again when it starts).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..world import current
from .attempt_words import slurm_stop_line, unsaved_line
from . import leftovers
from .checkpoint_dir import newest_checkpoint
from .ownership import claim, release
from .rundir import RunDir, failure_exit, failure_text
# the run directory's names, for modules that take them from here (hpcsuite.runs.rundir owns them)
from .rundir import ATTEMPTS as RECORDS, PREEMPTED as PREEMPTED_MARKER  # noqa: F401

SAVED = ("preempted", "time_limit")    # outcomes (and results.json statuses) that saved their work
# A stop (the warning signal, a preemption, the time limit) with no checkpoint at the step the
# ranks stopped at: no checkpoint keys, or a script that did not save on run.should_stop().
# Recorded as what it is, never as a save.
UNSAVED = "stopped"
FAILURES = ("failed", "lost")          # outcomes that count against max_failures


def checkpoint_root(job, run_dir: Path) -> Path:
    """Where ``job``'s checkpoints live: train.checkpoint.dir (job.json's is absolute: runner's
    prepare.anchored), else beside the job's run directories."""
    if job.train.checkpoint.dir:
        return Path(job.train.checkpoint.dir).absolute()
    return RunDir(run_dir).default_checkpoints


def attempt_number() -> int:
    """This attempt's number, for the batch script's commands and every rank: how often Slurm
    requeued the job."""
    return current().attempt


# ------------------------------------------------------------------- the record
def read_records(run_dir: str | Path) -> list[dict]:
    """The attempts recorded in ``run_dir`` (oldest first); a damaged line is a UserError."""
    path = RunDir(run_dir).attempts
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except PermissionError:
        from ..errors import permission_denied

        raise permission_denied(path) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg}); the attempt records "
                            "are damaged") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("attempt"), int) \
                or not isinstance(entry.get("outcome"), str):
            raise UserError(f"{path}:{number}: not an attempt record (needs attempt and outcome)")
        out.append(entry)
    return out


def _append(run_dir: Path, entry: dict) -> None:
    line = json.dumps({"time": dt.datetime.now().isoformat(timespec="seconds"), **entry},
                      sort_keys=True) + "\n"
    fd = os.open(RunDir(run_dir).attempts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Counts:
    attempts: int
    completed: int
    preempted: int        # preempted and time_limit: stopped with their work saved
    failed: int           # failed and lost

    def in_words(self) -> str:
        parts = [f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}"]
        if self.preempted:
            parts.append(f"{self.preempted} preempted or stopped at the time limit")
        if self.failed:
            parts.append(f"{self.failed} failed")
        return ", ".join(parts)


def counts(records: list[dict]) -> Counts:
    latest: dict[int, str] = {}
    for r in records:
        latest[r["attempt"]] = r["outcome"]
    outcomes = list(latest.values())
    return Counts(len(outcomes), outcomes.count("completed"),
                  sum(o in SAVED for o in outcomes), sum(o in FAILURES for o in outcomes))


def _earlier_states(job_id: str) -> list[str]:
    """Slurm accounting's state of each earlier attempt of ``job_id``, oldest first ([] when
    the cluster keeps no accounting)."""
    from .. import slurm

    try:
        done = slurm.call(["sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", "State"],
                          check=False, timeout=20, env=dict(os.environ))
    except UserError:
        return []
    if done.returncode != 0:
        return []
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _lost_outcome(state: str | None) -> tuple[str, str]:
    if state == "PREEMPTED":
        return "preempted", "preempted by Slurm"
    if state == "REQUEUED":   # scontrol requeue, PreemptMode=REQUEUE: killed before its record
        return "preempted", "requeued by Slurm"
    if state == "TIMEOUT":
        return "lost", "killed at the time limit"
    if state == "NODE_FAIL":
        return "lost", "a node failed"
    return "lost", f"ended without a record (Slurm: {state})" if state else \
        "ended without a record (killed: a node failure, a requeue or a cancel)"


# ------------------------------------------------------------------- begin and end
def begin(run_dir: Path, job, out=print) -> int:
    """Before an attempt launches: record earlier attempts that left no record, refuse to run
    once the failure budget is spent, claim the checkpoint directory. The exit status for the
    batch script: 0 to go on."""
    run_dir = Path(run_dir)
    n = attempt_number()
    records = read_records(run_dir)
    known = {r["attempt"] for r in records}
    missing = [k for k in range(n) if k not in known]
    if missing:
        job_id = current().job_id
        states = _earlier_states(job_id) if job_id else []
        for k in missing:
            outcome, why = _lost_outcome(states[k] if k < len(states) else None)
            entry = {"attempt": k, "outcome": outcome, "why": why}
            _append(run_dir, entry)
            records.append(entry)
    c = counts(records)
    budget = job.train.preemption.max_failures
    if c.failed > budget:
        out(f"hpcsuite: not starting attempt {n}: {c.failed} failed attempt(s), more than "
            f"train.preemption.max_failures ({budget}); {c.in_words()}")
        _append(run_dir, {"attempt": n, "outcome": "not_started",
                          "why": f"failure budget spent ({c.failed} > {budget})"})
        return 1
    if n and not leftovers.clear_to_launch(run_dir, n, records, out, FAILURES, _append, _requeue):
        return 1
    if job.train.checkpoint.enabled:
        claim(checkpoint_root(job, run_dir), current().job_id or "", run_dir)
    RunDir(run_dir).preempted.unlink(missing_ok=True)   # an earlier attempt's, never this one's
    if n:
        out(f"hpcsuite: attempt {n} of job {current().job_id}: before it, "
            f"{c.in_words()}")
    return 0


def _reached(run_dir: Path, n: int) -> int | None:
    """The step attempt ``n`` reached when rank 0 said none: its results' final step (it
    completed), else the step progress.json last showed (it failed on the way)."""
    from .results import read_progress

    rd = RunDir(run_dir)
    try:
        step = json.loads(rd.attempt_results(n).read_text()).get("final_step")
    except (OSError, ValueError, AttributeError):
        step = None
    if not isinstance(step, int):
        try:
            step = (read_progress(run_dir) or {}).get("step")
        except UserError:
            step = None
    return step if isinstance(step, int) else None


def begin_failed(run_dir: Path, e: Exception) -> str:
    """What stopped ``attempt begin`` before the ranks (a checkpoint directory it cannot
    create, a damaged record), kept in the attempt's FAILED marker for `status`; the line."""
    text = str(e) if isinstance(e, UserError) else \
        f"{getattr(e, 'filename', None) or ''}: {getattr(e, 'strerror', None) or e}".lstrip(": ")
    said = f"attempt {attempt_number()} could not start: {text}"
    marker = RunDir(run_dir).failed(attempt_number())
    try:
        if not marker.exists():
            marker.write_text(failure_text(None, 2, f"error: {said}", node=current().node))
    except OSError:
        pass                              # the log still says it
    return said


def _outcome(run_dir: Path, n: int, status: int, job) -> tuple[str, int | None, str | None]:
    """How attempt ``n`` ended, from the launcher's ``status`` and rank 0's marker: (outcome,
    the step its work is saved at, the stop signal the batch shell got when the launcher
    failed, or whose ranks saved and exited 0 on it: Open MPI 5's prterun holds SIGTERM, so
    a cancel ends with status 0 and rank 0's marker)."""
    marker = RunDir(run_dir).preempted   # rank 0 writes "STEP REASON" (signal, time_limit, unsaved)
    stop = stop_signal(run_dir, n)
    if status == 0 and not marker.is_file():
        stop = None                       # ran to its end: a late signal is said, not obeyed
    if stop and status != 0:
        # The batch shell got a stop signal and the launcher failed: when Slurm ends a job
        # (scontrol requeue, a preemption without the warning signal, a cancel) its SIGTERM
        # reaches every process, mpirun exits 1 at once, and the ranks it left behind, told
        # by the same signal, are still saving. Their stop is a preemption once rank 0 says so.
        _wait_for(marker, STOP_WAIT_S)
    if (status == 0 or stop) and marker.is_file():
        words = marker.read_text().split()
        step = int(words[0]) if words and words[0].isdigit() else None
        reason = words[1] if len(words) > 1 else "signal"
        if reason == "unsaved":
            return UNSAVED, step, stop
        return ("time_limit" if reason == "time_limit" else "preempted"), step, stop
    if stop and stop != job.train.preemption.signal:
        # Slurm's own TERM (a requeue, a preemption without the warning signal, a cancel) and
        # no marker: Slurm killed the ranks before rank 0 had saved (mpirun took the TERM too
        # and ended them, or Slurm's KillWait ran out). Not a failure of the job's: its work
        # is the newest checkpoint's, where the next attempt, if Slurm runs one, resumes.
        newest = newest_checkpoint(checkpoint_root(job, run_dir)) \
            if job.train.checkpoint.enabled else None
        return "preempted", (newest[1].get("step") if newest else None), stop
    return ("completed" if status == 0 else "failed"), None, stop


def end(run_dir: Path, job, status: int, out=print) -> int:
    """After the launcher returned ``status``: record the outcome, requeue the job when the
    spec and the budget allow (:func:`decide`), release the checkpoint directory otherwise.
    Returns the exit status for the batch script."""
    run_dir = Path(run_dir)
    n = attempt_number()
    status = _job_status(run_dir, n, status)
    job_id = current().job_id or ""
    pre = job.train.preemption
    marker = RunDir(run_dir).preempted
    outcome, step, stop = _outcome(run_dir, n, status, job)
    if step is None:
        step = _reached(run_dir, n)
    saved_at = None
    if outcome == UNSAVED and job.train.checkpoint.enabled:
        newest = newest_checkpoint(checkpoint_root(job, run_dir))
        saved_at = newest[1].get("step") if newest else None
    decision = decide(Ending(
        attempt=n, status=status, outcome=outcome, step=step, stop=stop,
        signal=stop or stop_signal(run_dir, n), saved_at=saved_at, marker_seen=marker.is_file(),
        failures=counts(read_records(run_dir)).failed + (outcome == "failed"),
        own_signal=pre.signal, requeue_on=pre.requeue, max_failures=pre.max_failures,
        script=bool(job.train.script)))
    for line in decision.said:
        out(line)
    requeued = False
    if decision.requeue:
        marker.unlink(missing_ok=True)
        out(f"hpcsuite: {decision.why}; requeueing job {job_id}")
        # Slurm's requeue TERMs this process too, which `attempt end` ignores (cli/job_cmd.py):
        # the record of what Slurm answered still comes.
        requeued = _requeue(job_id, out)
    _append(run_dir, {"attempt": n, "outcome": outcome, "exit": status, "step": step,
                      "host": current().node, "requeued": requeued, **decision.extra})
    if requeued:
        return status
    if job.train.checkpoint.enabled:
        release(checkpoint_root(job, run_dir), job_id)
    return status


@dataclass(frozen=True)
class Ending:
    """What is known once attempt ``attempt`` has ended: everything :func:`decide` reads."""
    attempt: int
    status: int             # the launcher's exit status (a failed rank's, where its marker says)
    outcome: str            # completed, preempted, time_limit, UNSAVED or failed (_outcome)
    step: int | None        # the step rank 0 stopped (and saved, but for UNSAVED) at
    stop: str | None        # the stop signal the batch shell got, when the launcher failed
    signal: str | None      # the stop signal the attempt got at all (its STOP-REQUESTED file)
    saved_at: int | None    # UNSAVED: the newest checkpoint's step, where the next one resumes
    marker_seen: bool       # rank 0's PREEMPTED marker is there
    failures: int           # failed attempts of the job, this one included
    own_signal: str         # train.preemption.signal
    requeue_on: bool        # train.preemption.requeue
    max_failures: int       # train.preemption.max_failures
    script: bool            # a user's script (train.script), not the managed loop


@dataclass(frozen=True)
class Decision:
    requeue: bool           # hpcsuite requeues the job (scontrol requeue)
    why: str | None         # said with "requeueing job N" when it does
    said: tuple             # the lines for the job's log, in order
    extra: dict             # what the attempt's record adds to outcome, exit and step


def decide(e: Ending) -> Decision:
    """Whether hpcsuite requeues the job after attempt ``e.attempt``, and what it says and
    records; no side effects. Slurm ending the job itself (a TERM that is not the job's own
    signal: Slurm requeues it or not, and a cancel must stay cancelled) is never requeued by
    hpcsuite; a save always is when train.preemption.requeue is on; a failure within
    max_failures is, but exit 2 (the spec's or the input's: it would fail again) never."""
    n, said, requeue, why, extra = e.attempt, [], False, None, {}
    slurm_ended = e.stop is not None and e.stop != e.own_signal
    if e.stop and e.outcome in (*SAVED, UNSAVED):
        extra["signal"] = e.stop
    if e.outcome == "completed" and e.signal:
        said.append(f"hpcsuite: attempt {n} got SIG{e.signal} and ran on to its end without "
                    "stopping" + (" (the script does not call run.should_stop() of "
                                  "hpcsuite.api, so it cannot stop on it)" if e.script else ""))
        extra["signal"] = e.signal
    elif e.outcome == UNSAVED:
        said.append(unsaved_line(n, e.signal, e.step, e.saved_at, e.script))
        extra.update(checkpoint_step=e.saved_at, **({"signal": e.signal} if e.signal else {}))
        if e.requeue_on and e.saved_at is not None and not slurm_ended:
            requeue, why = True, (f"attempt {n} stopped at step {e.step}; it resumes from the "
                                  f"checkpoint at step {e.saved_at}")
    elif e.outcome in SAVED:
        what = "stopped before the time limit" if e.outcome == "time_limit" else "preempted"
        if slurm_ended:
            said.append(slurm_stop_line(n, what, e.stop, e.step, e.marker_seen))
        elif e.requeue_on:
            requeue, why = True, f"attempt {n} {what} after saving a checkpoint at step {e.step}"
        else:
            said.append(f"hpcsuite: attempt {n} {what} after saving a checkpoint at step "
                        f"{e.step}; not requeued (train.preemption.requeue is off): submit the "
                        "same spec again to resume")
    elif e.outcome == "failed":
        if slurm_ended:     # a cancel that came before any save must stay cancelled
            said.append(f"hpcsuite: attempt {n} ended on SIG{e.stop} from Slurm before saving; "
                        "not requeued by hpcsuite: Slurm decides")
        elif e.status == 2:
            said.append(f"hpcsuite: attempt {n} failed (exit 2: the error hpcsuite reported "
                        "above); not requeued, it would fail the same way")
        elif e.failures <= e.max_failures:
            requeue, why = True, (f"attempt {n} failed (exit {e.status}); failure {e.failures} "
                                  f"of at most {e.max_failures} (train.preemption.max_failures)")
        elif e.max_failures:
            said.append(f"hpcsuite: attempt {n} failed (exit {e.status}); not requeued: "
                        f"{e.failures} failed attempts, more than train.preemption.max_failures "
                        f"({e.max_failures})")
    return Decision(requeue, why, tuple(said), extra)


def _requeue(job_id: str, out) -> bool:
    """`scontrol requeue JOB`; whether Slurm took it (what it said otherwise)."""
    from .. import slurm

    done = slurm.call(["scontrol", "requeue", job_id], check=False, timeout=60,
                      env=dict(os.environ))
    if done.returncode == 0:
        return True
    said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
    if "pending execution" in said:   # Slurm requeued it itself (a node failed)
        out(f"hpcsuite: job {job_id} is already requeued by Slurm")
    else:
        out(f"hpcsuite: scontrol requeue {job_id} failed: {said}")
    return False


STOP_WAIT_S = 8.0    # for rank 0's marker after the launcher died (within Slurm's KillWait)


def _job_status(run_dir: Path, n: int, status: int) -> int:
    """The launcher's ``status``, or the status a failed rank's FAILED marker names when the
    launcher failed too: srun, which ends the other ranks then, returns 128 + their signal
    (the highest status of its tasks), and the batch script ends a launcher that outlives the
    marker by a second (mpirun's 143). An input failure stays exit 2, never requeued."""
    if status != 0 and stop_signal(run_dir, n) is None:
        said = failure_exit(RunDir(run_dir).failed(n))
        if said:
            return said
    return status


def stop_signal(run_dir: Path, attempt: int) -> str | None:
    """The stop signal the batch shell got in ``attempt`` (its STOP-REQUESTED file), or None."""
    try:
        words = RunDir(run_dir).stop_requested(attempt).read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    return words[0] if words else None


def _wait_for(path: Path, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.is_file()
