"""Dependencies: a job's ``after`` (spec, ``submit --after JOB[:ok|any|notok]``) resolved to
the job ids sbatch's ``--dependency`` takes.

JOB is a job id or the name of a job submitted from the directory (its latest run in the
registry). Submitting checks each against Slurm: a job that already ended the way the
condition needs is nothing to wait for (it is left out: Slurm forgets finished jobs, and
sbatch refuses a dependency on a job it has forgotten); one that ended the other way can
never satisfy it, and the submission is refused rather than left pending forever.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError

WORDS = {"ok": "completed", "any": "ended", "notok": "failed"}


def split(entry: str) -> tuple[str, str]:
    """(JOB, condition) of ``JOB[:ok|any|notok]``; the condition defaults to ok."""
    job, _, condition = entry.rpartition(":")
    if job and condition in WORDS:
        return job, condition
    return entry, "ok"


def satisfied(state, condition: str) -> bool | None:
    """Whether a job in ``state`` satisfies ``condition``: True, False (never will), or None
    (it has not ended yet)."""
    if not state.finished:
        return None
    if condition == "any":
        return True
    return state.ok == (condition == "ok")


def job_ids_to_wait_for(after: list[str], workdir: str | Path, ask_slurm: bool = True, query=None,
            source: str = "after") -> tuple[list[str], list[str]]:
    """(``after`` as JOBID:condition entries left to wait for, notes on those left out).
    ``ask_slurm`` false: names become ids through the registry only (render, --dry-run).
    ``source``: where the entries come from, as errors name it (``SPEC: after``, ``--after``)."""
    from ..runs import registry

    if ask_slurm and query is None:
        from ..runs.jobs import query
    pending, notes = [], []
    for entry in after:
        run, condition = split(entry)
        try:
            job_id, _ = registry.locate(Path(workdir), run)
        except UserError as e:
            raise UserError(f"{source}: {entry}: {e}") from None
        if ask_slurm:
            try:
                state = query(job_id)
            except UserError as e:
                raise UserError(f"{source}: {entry}: {e}") from None
            done = satisfied(state, condition)
            if done is False:
                raise UserError(f"{source}: {entry}: job {job_id} ended {state.state}, so the "
                                f"condition '{condition}' (it {WORDS[condition]}) can never hold")
            if done:
                notes.append(f"job {job_id} already {WORDS[condition]} ({state.state}): "
                             "nothing to wait for")
                continue
        pending.append(f"{job_id}:{condition}")
    return list(dict.fromkeys(pending)), notes
