"""What ``hpcsuite attempt end`` says of an attempt that stopped: the sentences, apart from the
decision (:mod:`.attempts`) that picks them."""

from __future__ import annotations


def slurm_stop_line(n: int, what: str, stop: str, step: int | None, saved: bool) -> str:
    """What ``attempt end`` says when Slurm's own signal ended attempt ``n``."""
    how = f"after saving a checkpoint at step {step}" if saved else \
        (f"before it could save; its work is the checkpoint at step {step}"
         if step is not None else "before it could save; it has no checkpoint")
    return (f"hpcsuite: attempt {n} {what} on SIG{stop} from Slurm (a requeue, a preemption or "
            f"a cancel) {how}; Slurm decides whether it runs again")


def unsaved_line(n: int, signal: str | None, step: int | None, saved_at: int | None,
                 script: bool) -> str:
    """What ``attempt end`` says of a stop with no checkpoint at its step."""
    at = (f" on SIG{signal}" if signal else " before the time limit") + \
        (f" at step {step}" if step is not None else "")
    if saved_at is not None:
        lost = f"its work since the checkpoint at step {saved_at} is lost"
    elif script:
        lost = "no checkpoint exists (the script saved none through run.save())"
    else:
        lost = "no checkpoint exists (train.checkpoint is off): its training is lost"
    return f"hpcsuite: attempt {n} stopped{at} without saving a checkpoint; {lost}"
