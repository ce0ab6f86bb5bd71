"""wait: a submitted job followed to its end, as one Outcome."""

from __future__ import annotations

from typing import Callable

from ..errors import JobFailed, JobInputFailed, JobPreempted
from ..records import Record, record
from ..runs.mlflow_store import summary, summary_line
from ..runs.rundir import RunDir
from .status import StatusRecord

# How a followed job ended, and the exit code a command gives each.
COMPLETED, FAILED, INPUT_ERROR, STOPPED, NEVER_STARTS = (
    "completed", "failed", "input_error", "stopped", "never_starts")
EXIT_CODES = {COMPLETED: 0, FAILED: 1, INPUT_ERROR: 2, NEVER_STARTS: 2, STOPPED: 3}


@record
class Outcome(Record):
    """How a followed job ended."""

    job_id: str
    run_dir: str
    exit_class: str                    # completed | failed | input_error | stopped | never_starts
    state: object = None               # the last JobState (None: it never started)
    results: object = None             # Results, when the run directory has results.json
    log: str | None = None             # Slurm's log of the batch script
    tail: str = ""                     # its last lines, when the job failed
    message: str = ""                  # never_starts: why

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.exit_class]

    def to_json(self) -> dict:
        from ..runs import monitor_failures

        payload = {"job_id": self.job_id, "state": self.state.state, "run_dir": self.run_dir}
        if self.results is not None:
            payload["results"] = self.results.to_json()
        tracked = summary(self.run_dir) if self.run_dir else None
        if tracked:             # train.tracking: the MLflow run, a fall-back, a loss
            payload["tracking"] = tracked
        unwritten = monitor_failures.summary(self.run_dir)
        if unwritten:           # train.monitor: ranks that could not write their textfile
            payload["monitor"] = unwritten
        return payload

    def summary(self) -> str:
        """A completed or stopped job in words: its results, and in script mode the ranks that
        trained alone, or that its script records nothing through hpcsuite.api."""
        from ..runs import monitor_failures
        from ..runs.results import summarize
        from ..runs.script_ranks import lines, read

        said = lines(read(self.run_dir) if self.run_dir else [], self.job_id,
                     self.results is not None)
        unwritten = [f"  {line}" for line in [monitor_failures.summary_line(self.run_dir)] if line]
        if self.results is not None:
            return "\n".join([summarize(self.run_dir), *(f"  {line}" for line in said),
                              *(f"  {line}" for line in self.tracking_lines()), *unwritten])
        if not said:
            return "\n".join([f"job {self.job_id} completed; no results.json in {self.run_dir}",
                              *unwritten])
        return "\n".join([*(line if line.startswith("warning") else f"job {self.job_id} {line}"
                            for line in said), *unwritten])

    def tracking_lines(self) -> list[str]:
        """train.tracking: the MLflow run and its store, where it fell back to, what lost it."""
        line = summary_line(self.run_dir) if self.run_dir else None
        return [line] if line else []

    def failure(self) -> str:
        """The job's end, what its first failing rank reported (the launcher's own lines may
        push that out of the log's last lines: a stalled start names where the ranks stopped),
        and its log, in one message: for an exception its type and message, the rank and
        node, the user's file:line, and the traceback's last frames instead of the log's
        last lines (Open MPI's words on a rank that exited)."""
        from pathlib import Path

        from .status import error_rank, error_said, exit_words, reported_error

        said = reported_error(Path(self.run_dir)) if self.run_dir else None
        head = f"job {self.job_id} ended {self.state.state} " \
               f"({exit_words(self.state.exit_code, self.state.stdout)})"
        if said is None:
            return f"{head}; last lines of {self.log}:\n{self.tail}"
        head += f": {error_rank(said)}: {error_said(said)}"
        if said["frames"] is None:      # no traceback: the log's last lines say the rest
            return f"{head}; last lines of {self.log}:\n{self.tail}"
        return f"{head}\n{said['frames']}\nthe whole log: {self.log} (hpcsuite logs {self.job_id})"

    def error(self) -> Exception | None:
        """The exception a command ends with (its exit code is the outcome's), or None."""
        if self.exit_class == NEVER_STARTS:
            from ..runs.jobs import NeverStarts

            return NeverStarts(self.message)
        if self.exit_class == INPUT_ERROR:
            # The job ended on an error hpcsuite reported (bad input, a damaged file): that
            # one line first, and exit 2 as for any input error. What the failing rank wrote
            # in its FAILED marker, as for a failure: the log's `error: ` lines may be anyone's
            # (the site's setup, srun). With no marker (the batch script's own hpcsuite command
            # failed before any rank ran) the last of them, the one that ended the script.
            from pathlib import Path

            from .status import reported_error

            said = reported_error(Path(self.run_dir)) if self.run_dir else None
            logged = [l for l in self.tail.splitlines() if l.startswith("error: ")]
            why = said["message"] if said else logged[-1][7:] if logged else "exit 2"
            return JobInputFailed(f"job {self.job_id} ended {self.state.state}: {why}\n"
                                  f"last lines of {self.log}:\n{self.tail}")
        if self.exit_class == FAILED:
            return JobFailed(self.failure())
        if self.exit_class == STOPPED:
            r = self.results
            why = "before its time limit" if r.status == "time_limit" else "early"
            from ..runs.attempts import UNSAVED

            if r.status == UNSAVED:
                from ..runs.results import describe_stop

                return JobPreempted(f"job {self.job_id} stopped {describe_stop(r)}")
            return JobPreempted(f"job {self.job_id} stopped {why} after saving a checkpoint at "
                                f"step {r.final_step}; submit the same spec again to resume")
        return None


def wait(job_id: str, run_dir: str, timeout: float | None = None,
         on_progress: Callable[[StatusRecord], None] | None = None) -> Outcome:
    """Follow ``job_id`` to its end. ``on_progress(record)`` when its state changes and about
    every second after (state and the run directory's latest progress: the live line).
    Giving up after ``timeout`` seconds is a UserError; the job goes on."""
    from ..runs import jobs
    from ..runs.attempts import SAVED, UNSAVED
    from ..runs.results import Results

    current = {"state": None}

    def changed(state) -> None:
        current["state"] = state
        if on_progress:
            on_progress(StatusRecord.live(state, run_dir))

    def tick() -> None:
        if on_progress and current["state"] is not None:
            on_progress(StatusRecord.live(current["state"], run_dir))

    try:
        state = jobs.wait(job_id, timeout=timeout, on_change=changed, run_dir=run_dir,
                          on_tick=tick)
    except jobs.NeverStarts as e:
        return Outcome(job_id=job_id, run_dir=run_dir, exit_class=NEVER_STARTS,
                       state=current["state"], message=str(e))
    rd = RunDir(run_dir)
    results = Results.load(rd.results) if rd.results.is_file() else None
    log = jobs.log_path(state) or rd.slurm_log(job_id)
    if not state.ok:
        failed = INPUT_ERROR if (state.exit_code or "").startswith("2:") else FAILED
        return Outcome(job_id=job_id, run_dir=run_dir, exit_class=failed, state=state,
                       results=results, log=str(log), tail=jobs.tail(log))
    stopped = results is not None and results.status in (*SAVED, UNSAVED)
    return Outcome(job_id=job_id, run_dir=run_dir, exit_class=STOPPED if stopped else COMPLETED,
                   state=state, results=results, log=str(log))
