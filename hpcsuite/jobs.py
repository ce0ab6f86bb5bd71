"""Following submitted jobs: state, log file, waiting, cancelling."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from . import slurm
from .errors import UserError

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


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

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _check_id(job_id: str) -> str:
    if not (job_id.isascii() and job_id.isdigit() and len(job_id) <= 12):
        from .errors import show

        raise UserError(f"job id must be a number, got {show(job_id)}")
    return job_id


def query(job_id: str) -> JobState:
    """The job as the controller knows it; fall back to the jobcomp record of finished jobs."""
    _check_id(job_id)
    done = slurm.call(["scontrol", "show", "job", "-o", job_id], check=False, timeout=30)
    if done.returncode == 0:
        rec = slurm.parse_scontrol_record(done.stdout)
        if rec.get("JobState"):
            restarts = rec.get("Restarts", "")
            return JobState(job_id, rec["JobState"], rec.get("ExitCode", ""),
                            rec.get("StdOut"), rec.get("WorkDir"), rec.get("Reason"),
                            rec.get("RunTime"), int(restarts) if restarts.isdigit() else None)
    rec = _jobcomp_records({job_id}).get(job_id)
    if rec:
        return _from_jobcomp(job_id, rec)
    detail = (done.stderr or done.stdout).strip()
    raise UserError(f"job {job_id} is not known to Slurm ({detail or 'no record'})")


def query_many(job_ids: list[str]) -> dict[str, JobState]:
    """The state of many jobs in one squeue call (a login node is not asked once per job),
    the jobcomp records for the ones the controller has forgotten; jobs in neither are left
    out."""
    ids = [_check_id(j) for j in job_ids]
    found: dict[str, JobState] = {}
    for start in range(0, len(ids), 200):
        chunk = ids[start:start + 200]
        done = slurm.call(["squeue", "-h", "--states=all", "-j", ",".join(chunk),
                           "-o", "%i|%T|%M|%r"], check=False, timeout=30)
        if done.returncode != 0:
            continue
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 4 and parts[0] in chunk:
                found[parts[0]] = JobState(parts[0], parts[1], "", None, None,
                                           parts[3] or None, parts[2])
    missing = {j for j in ids if j not in found}
    if missing:
        for job_id, rec in _jobcomp_records(missing).items():
            found[job_id] = _from_jobcomp(job_id, rec)
    return found


def _from_jobcomp(job_id: str, rec: dict[str, str]) -> JobState:
    return JobState(job_id, rec.get("JobState", "UNKNOWN"), rec.get("ExitCode", ""), None,
                    rec.get("WorkDir"), None, _elapsed(rec.get("StartTime"), rec.get("EndTime")))


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


# Waiting asks Slurm rarely and the run directory often: Slurm every POLL_FIRST seconds at
# first, backing off to POLL_MAX; the run directory (a stat, no load on the controller) every
# second, and a change there (results written, a rank failed) asks Slurm again at once.
POLL_FIRST, POLL_MAX, POLL_GROWTH = 1.0, 15.0, 1.5


def _run_dir_mark(run_dir: Path | None) -> tuple:
    if run_dir is None:
        return ()
    try:
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.iterdir()
                            if p.name == "results.json" or p.name.startswith("FAILED")))
    except OSError:
        return ()


def wait(job_id: str, timeout: float | None = None, on_change=None, run_dir: str | None = None,
         on_tick=None) -> JobState:
    """Follow ``job_id`` to its end. ``on_change(state)`` when its state changes; ``on_tick()``
    about every second (live progress)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    directory = Path(run_dir) if run_dir else None
    last, interval = None, POLL_FIRST
    while True:
        state = query(job_id)
        if state.state != last and on_change:
            on_change(state)
        if state.state != last:
            interval = POLL_FIRST
        last = state.state
        if state.finished:
            return state
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(f"job {job_id} still {state.state} after {timeout:g}s")
        mark, until = _run_dir_mark(directory), time.monotonic() + interval
        interval = min(POLL_MAX, interval * POLL_GROWTH)
        while time.monotonic() < until:
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
            if on_tick:
                on_tick()
            if _run_dir_mark(directory) != mark:
                interval = POLL_FIRST      # the job is ending: follow it closely
                break


def log_path(state: JobState) -> Path | None:
    if state.stdout:
        return Path(state.stdout)
    return None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def cancel(job_id: str) -> None:
    slurm.call(["scancel", _check_id(job_id)], timeout=30)
