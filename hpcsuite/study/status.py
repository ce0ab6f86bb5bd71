"""Where each point of a study is: the study's own status (state.json) beside Slurm's state of
the point's job, asked now in one query for all of them (:func:`hpcsuite.runs.jobs.query_many`).

state.json's Slurm state is the one the last ``study run`` saw, often RUNNING for a job that
has written its results and not yet ended; a finished study shows each job's final state only
when Slurm is asked. When it cannot be (no Slurm here, the controller down) or no longer
knows a job, the row shows state.json's, and says so.
"""

from __future__ import annotations

from ..errors import UserError
from .points import StudyDir

RECORDED = "state.json"   # the source of a Slurm state that was not asked now


def status(sd: StudyDir, query=None) -> tuple[list[dict], str | None]:
    """(one row per point, a note when any Slurm state is state.json's). ``query``: the
    many-jobs state query, :func:`hpcsuite.runs.jobs.query_many` unless a test gives another."""
    if query is None:
        from ..runs.jobs import query_many as query
    state = sd.state()
    ids = sorted({str(e["job_id"]) for e in state.values() if e.get("job_id")})
    live, note = {}, None
    if ids:
        try:
            live = query(ids)
        except UserError as e:
            note = (f"Slurm could not be asked ({e}); the Slurm states shown are those "
                    f"{RECORDED} recorded at the last `study run`")
    rows = []
    for p in sd.points():
        e = state.get(p.id, {})
        job = e.get("job_id")
        known = live.get(str(job)) if job else None
        rows.append({"point": p.id, "kind": p.kind, "axes": p.axes, "job_id": job,
                     "status": e.get("status") or "not submitted",
                     "slurm": known.state if known else e.get("slurm"),
                     "slurm_from": known.source if known else (RECORDED if job else None),
                     "attempts": e.get("attempts", 0)})
    forgotten = [r["point"] for r in rows if r["slurm_from"] == RECORDED]
    if forgotten and note is None:
        note = (f"Slurm no longer knows the jobs of {len(forgotten)} point(s) "
                f"({', '.join(forgotten[:5])}{', ...' if len(forgotten) > 5 else ''}); their "
                f"Slurm state is the one {RECORDED} recorded")
    return rows, note
