"""What a rank reads and leaves in its run directory, for both modes and the entry point: the
resolved job, the host name it reports, the results and the preemption marker.

No framework, no training module: :mod:`.train` (the entry point), :mod:`hpcsuite.runtime.session.loop`, :mod:`hpcsuite.runtime.session.session`
and script mode (:mod:`hpcsuite.runtime.script.script_run`, :mod:`hpcsuite.runtime.script.script_job`) all import it, and it imports none of
them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import UserError
from ...runs.attempts import SAVED, UNSAVED, attempt_number
from ...runs.rundir import RunDir
from ...submit.spec import JobSpec, spec_from_dict
from ...world import current


def load_job(path: str) -> JobSpec:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object (the resolved job)")
    return spec_from_dict(data, path)


def hostname() -> str:
    """The Slurm node this rank runs on (:class:`hpcsuite.world.World`'s ``node``)."""
    return current().node


def job_id() -> str | None:
    return current().job_id


def write_stop_marker(run_dir: Path, status: str, step: int) -> None:
    """PREEMPTED ("STEP REASON") when the run stopped, for the batch script's `hpcsuite
    attempt end`: REASON is signal or time_limit with a checkpoint at STEP, unsaved without
    one; removed otherwise."""
    marker = RunDir(run_dir).preempted
    if status in SAVED:
        marker.write_text(f"{step} {'time_limit' if status == 'time_limit' else 'signal'}\n")
    elif status == UNSAVED:
        marker.write_text(f"{step} unsaved\n")
    else:
        marker.unlink(missing_ok=True)


def publish(run_dir: Path, results) -> Path:
    """Rank 0's last act: ``results`` (a :class:`~hpcsuite.runs.results.Results`) stamped with the
    Slurm job and attempt, written as results.json, and the preemption marker set or cleared."""
    results.job_id = job_id()
    results.attempt = attempt_number()
    path = results.write(run_dir)
    write_stop_marker(run_dir, results.status, results.final_step)
    return path
