"""What each rank of a script-mode job saw of its script once it returned: whether it ran
through ``hpcsuite.api`` (a Run), and the world Horovod (or MPI) gave it.

``hpcsuite train`` (:mod:`hpcsuite.runtime.script.script`) writes one word per rank and attempt,
``script/attempt-N/rank-R.json``; ``status``, ``submit --wait`` and ``report`` read them to say
what a job's results.json cannot: a script that records nothing through hpcsuite.api (its
output is its log), and ranks that each trained alone as a world of one because the script
never called ``hvd.init()``, although the launcher started several.
"""

from __future__ import annotations

import json
from pathlib import Path

from .rundir import RunDir


def word(rank: int, ranks: int, api: bool, horovod_size: int | None,
         mpi_size: int | None = None) -> dict:
    """Rank ``rank`` of the ``ranks`` the launcher started: ``api``, whether the script made a
    Run; ``horovod_size``, the world size Horovod gave it (None: never initialised);
    ``mpi_size``, MPI's world as mpi4py saw it, when the script used mpi4py itself."""
    return {"rank": rank, "ranks": ranks, "api": api, "horovod_size": horovod_size,
            "mpi_size": mpi_size}


def alone(w: dict) -> bool:
    """Whether this rank trained as a world of one although the launcher started more."""
    world = max(w.get("horovod_size") or 1, w.get("mpi_size") or 1)
    return (w.get("ranks") or 1) > 1 and world == 1


def read(run_dir: str | Path) -> list[dict]:
    """The words of the latest attempt that wrote any, by rank ([] without)."""
    rd = RunDir(run_dir)
    for attempt in sorted(rd.script_attempts(), reverse=True):
        words = []
        for path in rd.script_words(attempt):
            try:
                words.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue          # a rank killed while it wrote: the others still speak
        if words:
            return sorted(words, key=lambda w: w.get("rank", 0))
    return []


def records_nothing(words: list[dict]) -> bool:
    """Whether rank 0's script returned without making a Run: no results.json will come."""
    return any(w.get("rank") == 0 and not w.get("api") for w in words)


def nothing_recorded_line(job_id: str) -> str:
    return ("completed; the script records nothing through hpcsuite.api: its output is in "
            f"`hpcsuite logs {job_id}`")


def alone_line(words: list[dict]) -> str | None:
    """A warning naming the ranks that trained alone, or None."""
    lonely = [w["rank"] for w in words if alone(w)]
    if not lonely:
        return None
    ranks = max(w.get("ranks") or 1 for w in words)
    who = f"none of the {ranks} ranks joined" if len(lonely) == ranks else \
        ("rank " if len(lonely) == 1 else "ranks ") + ", ".join(str(r) for r in lonely) + \
        f" of {ranks} never joined"
    return (f"warning: {who} a Horovod world (the script never called hvd.init()): each "
            "trained alone as a world of one, not one distributed run")


def lines(words: list[dict], job_id: str, results: bool, completed: bool = True) -> list[str]:
    """What a finished job's summary and ``status`` add: the ranks that trained alone, and
    for a ``completed`` job without ``results`` a script that records nothing through
    hpcsuite.api."""
    out = [line for line in [alone_line(words)] if line]
    if completed and not results and records_nothing(words):
        out.append(nothing_recorded_line(job_id))
    return out
