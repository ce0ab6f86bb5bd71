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
            return JobState(job_id, rec["JobState"], rec.get("ExitCode", ""),
                            rec.get("StdOut"), rec.get("WorkDir"), rec.get("Reason"))
    rec = _jobcomp_record(job_id)
    if rec:
        return JobState(job_id, rec.get("JobState", "UNKNOWN"), rec.get("ExitCode", ""),
                        None, rec.get("WorkDir"), None)
    detail = (done.stderr or done.stdout).strip()
    raise UserError(f"job {job_id} is not known to Slurm ({detail or 'no record'})")


def _jobcomp_record(job_id: str) -> dict[str, str] | None:
    """jobcomp/filetxt keeps finished jobs when the controller has forgotten them."""
    done = slurm.call(["scontrol", "show", "config"], check=False, timeout=30)
    loc = None
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "JobCompLoc":
            loc = value.strip()
    if not loc or not Path(loc).is_file():
        return None
    found = None
    for line in Path(loc).read_text(errors="replace").splitlines():
        rec = slurm.parse_jobcomp_line(line)
        if rec.get("JobId") == job_id:
            found = rec   # the last record wins (a requeued job has several)
    return found


def wait(job_id: str, poll: float = 2.0, timeout: float | None = None,
         on_change=None) -> JobState:
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        state = query(job_id)
        if state.state != last and on_change:
            on_change(state)
        last = state.state
        if state.finished:
            return state
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(f"job {job_id} still {state.state} after {timeout:g}s")
        time.sleep(poll)


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
