"""Following a study's points through Slurm: submit what fits under max_in_flight, refresh
their states in one query, retry what failed (up to MAX_ATTEMPTS), until every point has ended.
The state is saved after each submission, so an interrupt loses nothing."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..records import Record, record
from ..runs.rundir import RunDir
from .points import MAX_ATTEMPTS, Point, StudyDir, base_job, point_request
from .bundle import complete_environment


@record
class Progress(Record):
    done: int
    failed: int
    running: int
    waiting: int
    total: int

    def line(self) -> str:
        return (f"{self.done}/{self.total} done, {self.running} in Slurm, {self.waiting} to "
                f"submit" + (f", {self.failed} failed" if self.failed else ""))


def point_result(sd: StudyDir, point: Point, job_id: str) -> Path:
    """The file a point's run leaves when it is done: the benchmark's report or results.json."""
    run = RunDir(sd.run_dir(point, job_id))
    return run.allreduce if point.kind == "allreduce" else run.results


def point_done(sd: StudyDir, point: Point, entry: dict) -> bool:
    job_id = entry.get("job_id")
    if not job_id:
        return False
    path = point_result(sd, point, job_id)
    if not path.is_file():
        return False
    if point.kind == "allreduce":
        return True
    try:
        return json.loads(path.read_text()).get("status") == "completed"
    except (OSError, json.JSONDecodeError):
        return False


def refresh(sd: StudyDir, state: dict) -> None:
    """Bring each submitted point's entry up to date with Slurm."""
    from ..runner import states

    points = {p.id: p for p in sd.points()}
    open_ = {pid: e for pid, e in state.items()
             if e.get("status") not in ("done", "failed") and e.get("job_id")}
    # One Slurm query for every point in flight, however many there are.
    known = states([e["job_id"] for e in open_.values()]) if open_ else {}
    for pid, entry in open_.items():
        point = points[pid]
        slurm_state = known.get(entry["job_id"])
        if slurm_state is not None:
            entry["slurm"] = slurm_state.state
            finished = slurm_state.finished
        else:
            entry["slurm"] = "UNKNOWN"
            finished = True              # the controller forgot it: judge by what it left
        judged = verdict(finished, finished and point_done(sd, point, entry),
                         entry.get("attempts", 0))
        if judged is not None:
            entry["status"] = judged


def verdict(finished: bool, results_complete: bool, attempts: int) -> str | None:
    """A submitted point's new status, None while it stays in flight. Done once its results
    are complete *and* Slurm has let the job go: a job still ending (epilog, MPI's teardown)
    holds its nodes, and `study run --wait` returns with none left."""
    if not finished:
        return None
    if results_complete:
        return "done"
    return "failed" if attempts >= MAX_ATTEMPTS else "retry"


def step(sd: StudyDir, profile_path: str | None, say: Callable[[str], None]) -> Progress:
    """One pass: refresh, then submit what fits under max_in_flight (through
    :func:`hpcsuite.runner.submit`, with a plain job's checks and record). Saves the state."""
    from ..runner import submit

    study = sd.study()
    state = sd.state()
    refresh(sd, state)
    sd.save_state(state)
    points = sd.points()
    in_flight = sum(1 for e in state.values() if e.get("status") == "submitted")
    base_spec = sd.workdir / sd.bundle()["base"]
    base = None
    for point in points:
        entry = state.setdefault(point.id, {"attempts": 0})
        if entry.get("status") in ("done", "failed", "submitted"):
            continue
        if in_flight >= study.max_in_flight:
            break
        if base is None:
            base = base_job(base_spec, profile_path)
        _, request = point_request(sd, study, base_spec, base, point, profile_path,
                                    from_bundle=True)
        done = submit(request)
        entry.update(job_id=done.job_id, status="submitted", slurm="PENDING",
                     attempts=entry.get("attempts", 0) + 1,
                     submitted=dt.datetime.now().isoformat(timespec="seconds"))
        state[point.id] = entry
        sd.save_state(state)               # after each submission: an interrupt loses nothing
        in_flight += 1
        axes = ", ".join(f"{k}={v}" for k, v in point.axes.items())
        say(f"submitted {point.id} ({point.kind}; {axes}) as job {done.job_id}")
    return progress(points, state)


def progress(points: list[Point], state: dict) -> Progress:
    status = [state.get(p.id, {}).get("status") for p in points]
    return Progress(done=status.count("done"), failed=status.count("failed"),
                    running=status.count("submitted"),
                    waiting=sum(1 for s in status if s in (None, "retry")), total=len(points))


def run(sd: StudyDir, profile_path: str | None, wait: bool, timeout: float | None,
        say: Callable[[str], None], poll: float = 2.0) -> Progress:
    deadline = None if timeout is None else time.monotonic() + timeout
    complete_environment(sd)
    last = None
    while True:
        now = step(sd, profile_path, say)
        if now != last:
            say(now.line())
            last = now
        if not wait or now.running == 0 and now.waiting == 0:
            return now
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(f"study {sd.path.name}: {now.line()} after {timeout:g}s; run "
                            "`hpcsuite study run` again to go on")
        time.sleep(poll)
