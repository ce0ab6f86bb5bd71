"""Where each element of a sweep is: its newest job (``ARRAYID_INDEX``) as Slurm shows it now,
asked in one query for every element, and whether its run directory holds a completed run."""

from __future__ import annotations

import time
from typing import Callable

from ..errors import UserError
from ..records import Record, record
from ..runs.jobs import NEVER_RAN as _NEVER_RAN
from .sweepdir import SweepDir


def element_rows(sd: SweepDir, query=None) -> tuple[dict[int, dict], str | None]:
    """(element index -> its row, a note when Slurm could not be asked). ``query``: the
    many-jobs state query (:func:`hpcsuite.runs.jobs.query_many` unless a test gives one)."""
    from ..runner.status import StatusRecord, describe_many
    from ..runs.jobs import TERMINAL

    current = sd.current_jobs()
    entries = {i: {"job_id": job_id, "run_dir": str(sd.run_dir(job_id)),
                   "array_job_id": job_id.partition("_")[0]}
               for i, (job_id, _) in current.items()}
    note = None
    try:
        records = dict(zip(entries, describe_many(list(entries.values()), query)))
    except UserError as e:
        note = f"Slurm could not be asked ({e}); states are what the run directories show"
        records = {i: StatusRecord.of_entry(e) for i, e in entries.items()}
    rows = {}
    for element in sd.elements():
        i = element.index
        record_ = records.get(i)
        job_id, submitted = current.get(i, (None, 0))
        done = _completed(entries[i]["run_dir"]) if i in entries else False
        state = record_.state.state if record_ is not None and record_.state is not None else \
            _unknown(job_id, entries.get(i, {}).get("run_dir"))
        rows[i] = {"index": i, "values": element.values, "job_id": job_id,
                   "submitted": submitted, "state": state, "done": done,
                   # it ended, or Slurm forgot it: judge it by what it left
                   "finished": done or state in TERMINAL or state in ("UNKNOWN", NEVER_RAN),
                   "elapsed": record_.state.elapsed if record_ and record_.state else None,
                   "step": (record_.progress or {}).get("step") if record_ else None,
                   "run_dir": entries[i]["run_dir"] if i in entries else None}
    return rows, note


# Slurm keeps no record of an array element cancelled before it started (it never became a
# job of its own): no record and no run directory says it never ran (runs.jobs names it).
NEVER_RAN = _NEVER_RAN


def _unknown(job_id: str | None, run_dir: str | None) -> str:
    from pathlib import Path

    if not job_id:
        return "NOT SUBMITTED"
    return "UNKNOWN" if run_dir and Path(run_dir).exists() else NEVER_RAN


def _completed(run_dir: str) -> bool:
    """Whether the run directory holds results.json of a completed run."""
    import json

    from ..runs.rundir import RunDir

    try:
        return json.loads(RunDir(run_dir).results.read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


@record
class Tally(Record):
    done: int
    failed: int                       # ended without completing, never_ran aside
    in_slurm: int
    total: int
    never_ran: int = 0                # cancelled before they started (state NEVER RAN)

    def line(self) -> str:
        return (f"{self.done}/{self.total} done, {self.in_slurm} in Slurm"
                + (f", {self.failed} failed" if self.failed else "")
                + (f", {self.never_ran} {NEVER_RAN.lower()} (cancelled before it started)"
                   if self.never_ran else ""))


def tally(rows: dict[int, dict]) -> Tally:
    values = list(rows.values())
    never = sum(r["state"] == NEVER_RAN and not r["done"] for r in values)
    return Tally(done=sum(r["done"] for r in values),
                 failed=sum(r["finished"] and not r["done"] for r in values) - never,
                 in_slurm=sum(bool(r["job_id"]) and not r["finished"] for r in values),
                 total=len(values), never_ran=never)


def wait(sd: SweepDir, timeout: float | None, say: Callable[[str], None], query=None,
         first: float = 2.0, most: float = 15.0) -> tuple[dict[int, dict], Tally]:
    """Follow every element to its end, asking Slurm every ``first`` seconds, backing off to
    ``most``; ``say`` a line whenever the tally changes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    interval, last = first, None
    while True:
        rows, note = element_rows(sd, query)
        now = tally(rows)
        if now != last:
            say(now.line() + (f" ({note})" if note else ""))
            last, interval = now, first
        if now.in_slurm == 0:
            return rows, now
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(f"sweep {sd.path.name}: {now.line()} after {timeout:g}s; the jobs go "
                            f"on (`hpcsuite sweep status {sd.path}`)")
        time.sleep(interval)
        interval = min(most, interval * 1.5)
