"""Who owns a checkpoint directory, and the submit-time check of one.

``OWNER.json`` in the checkpoint directory names the job writing there. A second job that would
write into a directory a live job owns is refused: at submit (:func:`check_before_submit`, which
also refuses a directory whose newest checkpoint already finished the run, or an earlier run's
checkpoints under ``resume: false``) and again when it starts (:func:`claim`, under a lock).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
from pathlib import Path

from ..errors import UserError
from ..world import current
from .checkpoint_dir import OWNER, newest_checkpoint
from .results import write_json_atomic
from .rundir import RunRoot

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


def _live_state(job_id: str) -> str | None:
    """The state of ``job_id`` when Slurm still runs or queues it, else None."""
    from .. import slurm

    if not job_id.isdigit():
        return None
    done = slurm.call(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False, timeout=30,
                      env=dict(os.environ))
    state = done.stdout.strip().split()
    return state[0] if done.returncode == 0 and state and state[0] in LIVE else None


def read_owner(root: Path) -> dict | None:
    path = Path(root) / OWNER
    try:
        owner = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except PermissionError:
        from ..errors import permission_denied

        raise permission_denied(path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}       # damaged: nobody we can check, so nobody
    return owner if isinstance(owner, dict) else {}


def _refusal(root: Path, owner: dict, state: str) -> UserError:
    return UserError(f"{root}: checkpoint directory in use by job {owner.get('job_id')} "
                     f"({state}, run directory {owner.get('run_dir')}); two jobs writing one "
                     "directory would overwrite each other's checkpoints. Wait for it, cancel it, "
                     "or set train.checkpoint.dir to another directory")


def check_owner(root: Path, job_id: str | None = None) -> None:
    """Refuse when another job that is still alive owns ``root``."""
    owner = read_owner(root)
    if owner and str(owner.get("job_id")) != str(job_id or ""):
        state = _live_state(str(owner.get("job_id", "")))
        if state:
            raise _refusal(root, owner, state)


def claim(root: Path, job_id: str, run_dir: Path) -> None:
    """Make ``job_id`` the owner of ``root`` unless a live job owns it (under a lock, so of
    two jobs starting at once exactly one gets it)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".owner.lock", os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        check_owner(root, job_id)
        write_json_atomic(root / OWNER, {
            "job_id": job_id, "run_dir": str(run_dir), "host": current().node,
            "since": dt.datetime.now().isoformat(timespec="seconds")})
    finally:
        os.close(fd)


def release(root: Path, job_id: str) -> None:
    owner = read_owner(root)
    if owner is not None and str(owner.get("job_id")) == str(job_id):
        (Path(root) / OWNER).unlink(missing_ok=True)


# ------------------------------------------------------------------- before submitting
def check_writable(root: Path, shown: str) -> None:
    """Refuse a checkpoint directory the job could not write (a read-only filesystem, a
    directory of another user's): it would fail before its first step, said only in its log."""
    where = next((p for p in (root, *root.parents) if p.exists()), None)
    if where is None or os.access(where, os.W_OK | os.X_OK) and where.is_dir():
        return
    if not where.is_dir():
        why = f"{where} is not a directory"
    else:
        try:
            read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = f"{where} is on a read-only filesystem" if read_only else \
            f"{where} is not writable by this user"
    raise UserError(f"{shown}: train.checkpoint.dir cannot be written ({why}); the job would "
                    "fail before its first step. Set train.checkpoint.dir to a directory the "
                    "job's user can write on the compute nodes")



def check_before_submit(job, workdir: str | Path) -> None:
    """Refuse, before sbatch, what would go wrong in the job: a checkpoint directory another
    live job owns, or one whose newest checkpoint already finished this run (resubmitting it
    would train 0 steps), or an earlier run's checkpoints under resume: false."""
    ck = job.train.checkpoint
    if not ck.enabled:
        return
    root = Path(ck.dir) if ck.dir else RunRoot.of(job.output_dir, job.name).checkpoints
    root = (Path(workdir) / root).absolute() if not root.is_absolute() else root
    check_writable(root, _shown(root, workdir))
    check_owner(root)
    newest = newest_checkpoint(root)
    if newest is None:
        return
    path, manifest = newest
    shown = _shown(root, workdir)
    if not ck.resume:
        raise UserError(f"{shown}: holds checkpoints of an earlier run (newest: {path.name}), "
                        "and train.checkpoint.resume is false: this run's checkpoints would mix "
                        "with them. Set train.checkpoint.dir to another directory, or remove "
                        f"{shown} to start over there")
    t = job.train
    step, epoch = manifest.get("step"), manifest.get("epoch")
    finished = (isinstance(epoch, int) and epoch >= (t.epochs or 1) and t.max_steps is None) or \
        (isinstance(epoch, int) and t.epochs is not None and epoch >= t.epochs) or \
        (t.max_steps is not None and isinstance(step, int) and step >= t.max_steps)
    if finished:
        upto = f"train.max_steps {t.max_steps}" if t.max_steps is not None and step >= t.max_steps \
            else f"train.epochs {t.epochs or 1}"
        raise UserError(
            f"{shown}/{path.name}: already holds a finished run of {job.name} (step {step}, "
            f"{upto} reached); submitting it again would train 0 steps. To train on from it, "
            f"raise {upto.split()[0]}; for a fresh run, set train.checkpoint.dir to another "
            f"directory or remove {shown}")


def _shown(path: Path, workdir) -> str:
    try:
        return str(path.relative_to(Path(workdir).absolute()))
    except ValueError:
        return str(path)
