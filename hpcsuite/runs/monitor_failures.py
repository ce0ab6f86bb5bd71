"""A rank that could not write its Prometheus textfile (``train.monitor.prometheus_dir``): its
record in the run directory (``monitor/rank-R.json``) and the line `status` and `submit --wait`
say about it.

The rank's sampler (:mod:`hpcsuite.runtime.observe.monitor`) writes the record when a write of
its textfile fails: it stops trying and the job trains on, so without the record only the rank's
log would say why a dashboard shows nothing of the job. A later attempt whose rank writes its
textfile again removes its record. Each rank writes its own file, only when it fails: nothing
is gathered.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .rundir import RunDir

LISTED = 4        # ranks a line names before it counts the rest


def record(run_dir: str | Path, rank: int, attempt: int, host: str, path: str | Path,
           error: str) -> None:
    """Rank ``rank`` (on ``host``, in ``attempt``) could not write its textfile ``path``;
    ``error``: the system's words. Never raises: telemetry is never a reason to stop training."""
    from .results import write_json_atomic

    target = RunDir(run_dir).monitor_failure(rank)
    try:
        target.parent.mkdir(exist_ok=True)
        write_json_atomic(target, {"rank": rank, "attempt": attempt, "host": host,
                                   "path": str(path), "error": error, "at": time.time()},
                          durable=False)
    except OSError as e:
        import logging

        logging.getLogger(__name__).warning(
            "train.monitor: cannot record the failure in %s (%s)", target, e.strerror or e)


def clear(run_dir: str | Path, rank: int) -> None:
    """Rank ``rank`` wrote its textfile: an earlier attempt's record of a failure goes."""
    try:
        RunDir(run_dir).monitor_failure(rank).unlink(missing_ok=True)
    except OSError:
        pass         # not ours to remove: status says the older attempt's failure


def read(run_dir: str | Path) -> list[dict]:
    """The records of the latest attempt that has any, by rank ([] without). A damaged or
    unreadable one is passed over: the others still speak."""
    pattern = RunDir(run_dir).monitor_failure("*")
    found = []
    for path in sorted(pattern.parent.glob(pattern.name)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            found.append(data)
    if not found:
        return []
    latest = max(r.get("attempt") or 0 for r in found)
    return sorted((r for r in found if (r.get("attempt") or 0) == latest), key=lambda r: r["rank"])


def summary(run_dir: str | Path | None) -> list[dict] | None:
    """The records for `status --json` and `submit --wait --json`; None without any."""
    return (read(run_dir) or None) if run_dir else None


def summary_line(run_dir: str | Path | None) -> str | None:
    """The one line `status` and `submit --wait` print: which ranks, in which attempt, the
    first one's file and what the system said; None when every textfile was written."""
    records = summary(run_dir)
    if not records:
        return None
    ranks = [r["rank"] for r in records]
    first = records[0]
    if len(ranks) == 1:
        on = f" on {first['host']}" if first.get("host") else ""
        who, whose, files, said = f"rank {ranks[0]}{on}", "its", "textfile", ""
    else:
        more = f" and {len(ranks) - LISTED} more" if len(ranks) > LISTED else ""
        who = "ranks " + ", ".join(str(r) for r in ranks[:LISTED]) + more
        whose, files, said = "their", "textfiles", f"rank {ranks[0]}: "
    return (f"monitor: {who} could not write {whose} Prometheus {files} in attempt "
            f"{first.get('attempt') or 0} ({said}{first.get('path')}: {first.get('error')}): "
            f"{whose} metrics are not exported; training does not stop for it")
