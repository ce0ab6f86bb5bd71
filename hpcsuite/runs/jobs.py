"""Following submitted jobs: state, log file, waiting, cancelling.

Where a job's state comes from, best first: Slurm accounting (``sacct``: kept after the job
ends, with exit codes, MaxRSS and every requeued attempt) when the cluster runs slurmdbd; the
controller (``scontrol``/``squeue``: live, but it forgets a finished job after MinJobAge);
the job completion log (``jobcomp/filetxt``) when the controller has forgotten it."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .. import slurm
from ..errors import UserError
from .rundir import RunDir

# An element of a job array cancelled while it waited: Slurm keeps no record of it (it never
# became a job of its own) and it left no run directory. hpcsuite's name for that state, the
# same in `status`, `runs` and `sweep status`.
NEVER_RAN = "NEVER RAN"
NEVER_RAN_WHY = "cancelled before it started: Slurm keeps no record of it and it has no run directory"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", NEVER_RAN}


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    exit_code: str
    stdout: str | None
    workdir: str | None
    reason: str | None
    elapsed: str | None = None       # Slurm's [D-]HH:MM:SS
    restarts: int | None = None      # times Slurm requeued it
    max_rss: str | None = None       # the largest MaxRSS of its steps (sacct), e.g. "322M"
    source: str = "scontrol"         # scontrol, squeue, sacct or jobcomp
    start_time: str | None = None    # when Slurm expects to start it (scontrol), if pending

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    def to_json(self) -> dict:
        return dict(self.__dict__)


# A job id, or an element of a job array as Slurm names it (ARRAYID_INDEX: squeue, sacct,
# scontrol and scancel all take it).
_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,7})?")


def is_job_id(text: str) -> bool:
    return bool(_JOB_ID.fullmatch(text)) and text.isascii()


def _check_id(job_id: str) -> str:
    if not is_job_id(job_id):
        from ..errors import show

        raise UserError(f"job id must be a number (or ARRAYID_INDEX for an element of a job "
                        f"array), got {show(job_id)}")
    return job_id


def query(job_id: str) -> JobState:
    """The job as the controller knows it (live), with its accounting record once it has
    finished; accounting alone, or the jobcomp record, once the controller has forgotten it."""
    _check_id(job_id)
    done = slurm.call(["scontrol", "show", "job", "-o", job_id], check=False, timeout=30)
    if done.returncode != 0 and not _unknown_id(done.stderr + done.stdout):
        raise slurm.failure(done)        # Slurm itself does not answer
    live = None
    if done.returncode == 0:
        rec = slurm.parse_scontrol_record(done.stdout)
        if rec.get("JobState"):
            restarts = rec.get("Restarts", "")
            live = JobState(job_id, rec["JobState"], rec.get("ExitCode", ""),
                            rec.get("StdOut"), rec.get("WorkDir"),
                            rec.get("Reason") if rec.get("Reason") not in ("None", "") else None,
                            rec.get("RunTime"), int(restarts) if restarts.isdigit() else None,
                            start_time=rec.get("StartTime"))
    if live is not None and not live.finished:
        return live               # a job that runs or waits: the controller is the fresh source
    acct = accounting([job_id]).get(job_id)
    if live is not None and acct is not None:
        return replace(live, max_rss=acct.max_rss, exit_code=live.exit_code or acct.exit_code,
                       restarts=max(live.restarts or 0, acct.restarts or 0) or None,
                       source="scontrol+sacct")
    if live is not None or acct is not None:
        return live or acct
    rec = _jobcomp_records({job_id}).get(job_id)
    if rec:
        return _from_jobcomp(job_id, rec)
    detail = (done.stderr or done.stdout).strip()
    raise UnknownJob(f"job {job_id} is not known to Slurm ({detail or 'no record'})")


class UnknownJob(UserError):
    """Slurm answered, and has no record of the job (exit 2)."""


def _unknown_id(stderr: str) -> bool:
    """Whether scontrol/squeue refused the id as one it does not know: "Invalid job id
    specified", or "Job 13_5 not found" (scontrol 22.05 prints that one on stdout) for an
    element its array no longer holds."""
    text = stderr.lower()
    return "invalid job id" in text or "not found" in text


def never_ran(job_id: str) -> JobState:
    """The state of an array element Slurm has no record of and that left no run directory."""
    return JobState(job_id, NEVER_RAN, "", None, None, NEVER_RAN_WHY, source="hpcsuite")


def query_many(job_ids: list[str]) -> dict[str, JobState]:
    """The state of many jobs in one call, not one per job (a login node is not hammered):
    sacct when the cluster keeps accounting, squeue for the jobs it has no record of yet, the
    jobcomp records for the ones the controller has forgotten; jobs in none are left out."""
    ids = [_check_id(j) for j in job_ids]
    found: dict[str, JobState] = dict(accounting(ids))
    rest = [j for j in ids if j not in found]
    for start in range(0, len(rest), 200):
        chunk = rest[start:start + 200]
        # -r: an array's pending elements one per line (ARRAYID_INDEX), not folded into one
        done = slurm.call(["squeue", "-h", "-r", "--states=all", "-j", ",".join(chunk),
                           "-o", "%i|%T|%M|%r"], check=False, timeout=30)
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                continue      # none of them is known any more: the jobcomp records may be
            raise slurm.failure(done)
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 4 and parts[0] in chunk:
                found[parts[0]] = JobState(parts[0], parts[1], "", None, None,
                                           parts[3] if parts[3] not in ("None", "") else None,
                                           parts[2], source="squeue")
    missing = {j for j in ids if j not in found}
    if missing:
        for job_id, rec in _jobcomp_records(missing).items():
            found[job_id] = _from_jobcomp(job_id, rec)
    return found


def _from_jobcomp(job_id: str, rec: dict[str, str]) -> JobState:
    return JobState(job_id, rec.get("JobState", "UNKNOWN"), rec.get("ExitCode", ""), None,
                    rec.get("WorkDir"), None, _elapsed(rec.get("StartTime"), rec.get("EndTime")),
                    source="jobcomp")


# --------------------------------------------------------------------------- accounting

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "MaxRSS", "WorkDir")


def accounting(job_ids: list[str]) -> dict[str, JobState]:
    """The jobs' accounting records, in one ``sacct`` call per 200 jobs; {} where the cluster
    keeps no accounting (sacct fails at once there)."""
    found: dict[str, JobState] = {}
    for start in range(0, len(job_ids), 200):
        chunk = [_check_id(j) for j in job_ids[start:start + 200]]
        # -D: every attempt of a requeued job; -P: fields split by a bar, no padding.
        done = slurm.call(["sacct", "-n", "-P", "-D", "-j", ",".join(chunk),
                           "-o", ",".join(SACCT_FIELDS)], check=False, timeout=30)
        if done.returncode != 0:
            return {}            # "accounting storage is disabled", or slurmdbd is down
        found.update(parse_sacct(done.stdout, set(chunk)))
    return found


def parse_sacct(stdout: str, wanted: set[str] | None = None) -> dict[str, JobState]:
    """``sacct -n -P -D -o JobID,State,ExitCode,Elapsed,MaxRSS,WorkDir`` to one JobState per
    job: the state, exit code and elapsed time of its latest attempt, the attempts before it
    as requeues, the largest MaxRSS of any of its steps."""
    rows: dict[str, list[list[str]]] = {}
    steps_rss: dict[str, list[int]] = {}
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            continue
        job, _, step = parts[0].partition(".")
        if not is_job_id(job) or (wanted is not None and job not in wanted):
            continue
        if step:
            rss = _bytes(parts[4])
            if rss is not None:
                steps_rss.setdefault(job, []).append(rss)
        else:
            rows.setdefault(job, []).append(parts)
    out = {}
    for job, attempts in rows.items():
        last = attempts[-1]
        rss = max(steps_rss.get(job, []), default=None)
        out[job] = JobState(job, last[1].split()[0] if last[1].strip() else "UNKNOWN", last[2],
                            None, last[5] or None, None, last[3] or None,
                            len(attempts) - 1 or None,
                            _human_bytes(rss) if rss is not None else None, source="sacct")
    return out


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def _bytes(text: str) -> int | None:
    """sacct's MaxRSS (``25808K``, ``1.5G``, ``0``) in bytes; None when empty or unreadable."""
    text = text.strip()
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    try:
        return int(float(text[:-1] if unit else text) * _UNITS[unit])
    except (ValueError, KeyError):
        return None


def _human_bytes(n: int) -> str:
    for unit in ("P", "T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.3g}{unit}"
    return str(n)


def _elapsed(start: str | None, end: str | None) -> str | None:
    import datetime as dt

    try:
        seconds = int((dt.datetime.fromisoformat(end or "") -
                       dt.datetime.fromisoformat(start or "")).total_seconds())
    except ValueError:
        return None
    days, rest = divmod(max(0, seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _jobcomp_records(job_ids: set[str]) -> dict[str, dict[str, str]]:
    """jobcomp/filetxt keeps finished jobs when the controller has forgotten them."""
    done = slurm.call(["scontrol", "show", "config"], check=False, timeout=30)
    loc = None
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "JobCompLoc":
            loc = value.strip()
    if not loc or not Path(loc).is_file():
        return {}
    found: dict[str, dict[str, str]] = {}
    for line in Path(loc).read_text(errors="replace").splitlines():
        if "JobId=" not in line:
            continue
        rec = slurm.parse_jobcomp_line(line)
        if rec.get("JobId") in job_ids:
            found[rec["JobId"]] = rec   # the last record wins (a requeued job has several)
    return found


# --------------------------------------------------------------------------- pending reasons

# Pending reasons a job does not leave by waiting (Slurm's "Job Reason Codes"): it asks for more
# than its partition, QOS or association lets one job have, or for what does not exist. Only a
# change by the site (or cancelling the job) ends them.
NEVER_STARTS = {
    "PartitionConfig": "it asks for more than its partition is configured to give one job "
                       "(nodes, CPUs, GPUs or memory per node)",
    "PartitionNodeLimit": "it asks for more nodes than its partition lets one job have",
    "PartitionTimeLimit": "its time limit is longer than its partition allows",
    "BadConstraints": "no node has the features (constraint) it asks for",
    "InvalidAccount": "its account does not exist or may not use this partition",
    "InvalidQOS": "its QOS does not exist or its account may not use it",
    "DependencyNeverSatisfied": "it depends on a job that ended in a way the dependency excludes",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than its QOS lets one job have",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than its QOS lets one job have",
    "QOSMaxGRESPerJob": "it asks for more GPUs (gres) than its QOS lets one job have",
    "QOSMaxWallDurationPerJobLimit": "its time limit is longer than its QOS allows",
    "AssocMaxNodesPerJobLimit": "it asks for more nodes than its account lets one job have",
    "AssocMaxCpuPerJobLimit": "it asks for more CPUs than its account lets one job have",
    "AssocMaxWallDurationPerJobLimit": "its time limit is longer than its account allows",
}
# Requested nodes that are down, drained or reserved: they may come back, so this counts as
# never only after it has lasted NODES_GONE_SECONDS, and never for a requeued job (its node
# was lost and Slurm re-places it once the node returns).
NODES_GONE = "ReqNodeNotAvail"
NODES_GONE_SECONDS = 120.0
EXPLAINED = {
    "Priority": "other jobs come first",
    "Resources": "waiting for nodes to free up",
    "Dependency": "waiting for the job it depends on",
    "JobHeldUser": "held (scontrol release JOBID starts it)",
    "JobHeldAdmin": "held by an administrator",
    NODES_GONE: "a node it needs is down, drained or reserved",
}


def reason_code(state: JobState) -> str:
    """Slurm's reason without its detail ("ReqNodeNotAvail, UnavailableNodes:n2" -> the code)."""
    return (state.reason or "").split(",")[0].strip()


def explain_pending(state: JobState, pending_for: float = 0.0) -> tuple[str, bool] | None:
    """(why the job waits, in words; whether it can never start) for a pending job, or None."""
    if state.state != "PENDING":
        return None
    code = reason_code(state)
    if code == "BeginTime" and state.restarts:
        when = f" until {state.start_time}" if state.start_time not in (None, "", "Unknown") else ""
        return (f"requeued (attempt {state.restarts}); Slurm holds a requeued job{when} "
                "before it starts again (its requeue delay)", False)
    if code == "BeginTime":
        return f"starts at its begin time{f' ({state.start_time})' if state.start_time else ''}", False
    if code in NEVER_STARTS:
        return f"{code}: {NEVER_STARTS[code]}", True
    if code == NODES_GONE:
        return (f"{state.reason}: {EXPLAINED[code]}",
                not state.restarts and pending_for >= NODES_GONE_SECONDS)
    if code in EXPLAINED:
        return f"{code}: {EXPLAINED[code]}", False
    return (code, False) if code and code != "None" else None


class NeverStarts(UserError):
    """A job pends for a reason it cannot leave (exit 2: its input asks for the impossible)."""


# Waiting asks Slurm rarely and the run directory often: Slurm every POLL_FIRST seconds at
# first, backing off to POLL_MAX; the run directory (a stat, no load on the controller) every
# second, and a change there (results written, a rank failed) asks Slurm again at once and
# every POLL_FIRST seconds for ENDING_S after (the job is ending: its end is said at once).
POLL_FIRST, POLL_MAX, POLL_GROWTH, ENDING_S = 1.0, 15.0, 1.5, 60.0


def _run_dir_mark(run_dir: Path | None) -> tuple:
    if run_dir is None:
        return ()
    try:
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.iterdir()
                            if RunDir.is_outcome(p.name)))
    except OSError:
        return ()


def wait(job_id: str, timeout: float | None = None, on_change=None, run_dir: str | None = None,
         on_tick=None) -> JobState:
    """Follow ``job_id`` to its end. ``on_change(state)`` when its state changes; ``on_tick()``
    about every second (live progress)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    directory = Path(run_dir) if run_dir else None
    last, interval = None, POLL_FIRST
    reason, reason_since, ending_until = None, time.monotonic(), float("-inf")
    while True:
        state = query(job_id)
        if state.state != last and on_change:
            on_change(state)
        if state.state != last:
            interval = POLL_FIRST
        last = state.state
        if state.finished:
            return state
        if (state.state, state.reason) != reason:
            reason, reason_since = (state.state, state.reason), time.monotonic()
        why = explain_pending(state, time.monotonic() - reason_since)
        if why and why[1]:
            raise NeverStarts(f"job {job_id} can never start: {why[0]}. It is still queued; "
                              f"`hpcsuite cancel {job_id}` removes it")
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(f"job {job_id} still {state.state} after {timeout:g}s")
        mark, until = _run_dir_mark(directory), time.monotonic() + interval
        interval = POLL_FIRST if time.monotonic() < ending_until else \
            min(POLL_MAX, interval * POLL_GROWTH)
        while time.monotonic() < until:
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
            if on_tick:
                on_tick()
            if _run_dir_mark(directory) != mark:
                interval = POLL_FIRST      # the job is ending: follow it closely
                ending_until = time.monotonic() + ENDING_S
                break


def log_path(state: JobState) -> Path | None:
    return Path(state.stdout) if state.stdout else None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class NothingToCancel(UserError):
    """The job had ended, was cancelled already, or Slurm does not know it (exit 2)."""


def active(job_id: str) -> dict[str, str]:
    """The job's parts that wait or run now ({id: state}): the job, or a job array's elements
    (squeue -r lists them one per line); {} when none does or Slurm does not know the id."""
    done = slurm.call(["squeue", "-h", "-r", "--states=all", "-j", _check_id(job_id),
                       "-o", "%i|%T"], check=False, timeout=30)
    if done.returncode != 0:
        if _unknown_id(done.stderr + done.stdout):
            return {}
        raise slurm.failure(done)
    found = {}
    for line in done.stdout.splitlines():
        part, _, state = line.strip().partition("|")
        if part and state and state not in TERMINAL:
            found[part] = state
    return found


def cancel(job_id: str) -> str:
    """Cancel the job (every element of a job array that still waits or runs); what was
    cancelled, in words. Nothing to cancel is a :class:`NothingToCancel` saying why."""
    parts = active(job_id)
    if not parts:
        raise NothingToCancel(_nothing_to_cancel(job_id))
    done = slurm.call(["scancel", job_id], check=False, timeout=30)
    if done.returncode != 0:
        if active(job_id):
            raise slurm.failure(done)
        raise NothingToCancel(_nothing_to_cancel(job_id))     # it ended meanwhile
    if list(parts) == [job_id]:
        return f"cancelled {job_id} (it was {parts[job_id]})"
    counts: dict[str, int] = {}
    for state in parts.values():
        counts[state] = counts.get(state, 0) + 1
    return (f"cancelled {job_id}: {len(parts)} element(s), "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))


def _nothing_to_cancel(job_id: str) -> str:
    try:
        state = query(job_id)
    except UnknownJob:
        if "_" in job_id:
            return (f"job {job_id} is not known to Slurm (an element of a job array cancelled "
                    "before it started leaves no record): nothing to cancel")
        return (f"job {job_id} is not known to Slurm: nothing to cancel (`hpcsuite runs` lists "
                "the jobs submitted from here)")
    if state.state == "CANCELLED":
        return f"job {job_id} was already cancelled: nothing to cancel"
    exit_code = f", exit {state.exit_code}" if state.exit_code else ""
    return f"job {job_id} has already ended ({state.state}{exit_code}): nothing to cancel"
