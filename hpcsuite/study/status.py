"""Where each point of a study is: the study's own status (state.json) beside Slurm's state of
the point's job, asked now in one query for all of them. Each job's Slurm part is the
:class:`~hpcsuite.runner.StatusRecord` that ``runs`` prints (:func:`hpcsuite.runner.describe_many`):
its state, elapsed time, source and latest step.

state.json's Slurm state is the one the last ``study run`` saw, often RUNNING for a job that
has written its results and not yet ended; a finished study shows each job's final state only
when Slurm is asked. When it cannot be (no Slurm here, the controller down) or no longer
knows a job, the row shows state.json's, and says so.
"""

from __future__ import annotations

from ..errors import UserError
from .points import Point, StudyDir

RECORDED = "state.json"   # the source of a Slurm state that was not asked now


def status(sd: StudyDir, query=None) -> tuple[list[dict], str | None]:
    """(one row per point, a note when any Slurm state is state.json's). ``query``: the
    many-jobs state query, :func:`hpcsuite.runs.jobs.query_many` unless a test gives another."""
    from ..runner.status import StatusRecord, describe_many

    state = sd.state()
    points = sd.points()
    entries = {p.id: {"job_id": str(e["job_id"]), "run_dir": str(sd.run_dir(p, str(e["job_id"])))}
               for p in points if (e := state.get(p.id, {})).get("job_id")}
    note = None
    try:
        records = describe_many(list(entries.values()), query)
    except UserError as e:
        note = (f"Slurm could not be asked ({e}); the Slurm states shown are those "
                f"{RECORDED} recorded at the last `study run`")
        records = [StatusRecord.of_entry(entry) for entry in entries.values()]
    described = dict(zip(entries, records))
    rows = [point_row(p, state.get(p.id, {}), described.get(p.id)) for p in points]
    forgotten = [r["point"] for r in rows if r["slurm_from"] == RECORDED]
    if forgotten and note is None:
        note = (f"Slurm no longer knows the jobs of {len(forgotten)} point(s) "
                f"({', '.join(forgotten[:5])}{', ...' if len(forgotten) > 5 else ''}); their "
                f"Slurm state is the one {RECORDED} recorded")
    return rows, note


def point_row(point: Point, entry: dict, record) -> dict:
    """One point: state.json's entry, and the Slurm part of its job's StatusRecord (``record``,
    None when never submitted) where Slurm answered for the job, else state.json's."""
    job = entry.get("job_id")
    described = record.row() if record is not None else {}
    asked = record is not None and record.state is not None
    return {"point": point.id, "kind": point.kind, "axes": point.axes, "job_id": job,
            "status": entry.get("status") or "not submitted",
            "slurm": described["state"] if asked else entry.get("slurm"),
            "slurm_from": described["source"] if asked else (RECORDED if job else None),
            "attempts": entry.get("attempts", 0),
            "elapsed": described.get("elapsed"), "step": described.get("step")}
