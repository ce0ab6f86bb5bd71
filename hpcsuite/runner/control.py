"""The runner's verbs on a submitted job besides wait and describe: its state now, its
output (where, why none yet, following it), cancelling it. Each is one call into
:mod:`hpcsuite.runs.jobs`, which asks Slurm; commands and rooms above call these, never it."""

from __future__ import annotations

from pathlib import Path

from ..runs.rundir import RunDir


def state(job_id: str, entry: dict | None = None):
    """The job's :class:`~hpcsuite.runs.jobs.JobState` now (of a copy fetched from a remote,
    its registry ``entry``: what that Slurm said then)."""
    from ..runs import jobs, registry

    return registry.copied_state(entry) if entry and entry.get("remote") else jobs.query(job_id)


def states(job_ids: list[str]) -> dict:
    """Every job's :class:`~hpcsuite.runs.jobs.JobState` in one query (job id -> state; a
    job Slurm has forgotten is absent)."""
    from ..runs import jobs

    return jobs.query_many(job_ids)


def slurm_log(job_id: str, job_state, run_dir: Path | None) -> Path | None:
    """The job's Slurm output file: where Slurm says, else the run directory's."""
    from ..runs import jobs

    path = jobs.log_path(job_state)
    if path is None and run_dir is not None:
        path = RunDir(run_dir).slurm_log(job_id)
    return path


def waiting(job_state) -> tuple[str, bool] | None:
    """Why a pending job waits, in words, and whether it can never start (None: it does not
    wait)."""
    from ..runs import jobs

    return jobs.explain_pending(job_state)


def follow(job_id: str, run_dir: Path | None, on_tick) -> None:
    """Return once the job has ended, calling ``on_tick()`` about every second (a log
    followed)."""
    from ..runs import jobs

    jobs.wait(job_id, run_dir=str(run_dir) if run_dir else None, on_tick=on_tick)


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a job's log (or a line saying there is none)."""
    from ..runs import jobs

    return jobs.tail(path, lines)


def cancel(job_id: str) -> str:
    """Cancel the job (every element of a job array that still waits or runs); what was
    cancelled, in words, or a :class:`~hpcsuite.runs.jobs.NothingToCancel` saying why not."""
    from ..runs import jobs

    return jobs.cancel(job_id)
