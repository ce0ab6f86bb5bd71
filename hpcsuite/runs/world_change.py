"""A run resumed at another world size: what changed and what it means.

A checkpoint records the world it was written by (``world_size``, ``batch_size``,
``grad_accumulation``). Resuming it on another number of ranks is allowed (the sharding cursor
continues exactly), but one optimizer step then trains another number of samples: the global
batch is batch per rank x accumulation x ranks. ``train.max_steps`` counts steps, so the same
limit now trains more or fewer samples; ``train.epochs`` counts samples, so an epoch now takes
more or fewer steps. Rank 0 says so in the job's log when it resumes (:func:`change`), and
results.json keeps the record, which ``status`` and ``submit --wait`` show (:func:`in_words`).
"""

from __future__ import annotations


def change(manifest: dict, batch_size: int, grad_accumulation: int, size: int,
           step: int, max_steps: int | None) -> dict | None:
    """The world change from the checkpoint's ``manifest`` to this attempt (``size`` ranks of
    ``batch_size`` x ``grad_accumulation``) at ``step``, or None when the world is the same
    or the checkpoint did not record its own (an older one without batch settings: this
    job's are taken). ``max_steps``: train.max_steps (None: epochs bound the run)."""
    before_ranks = manifest.get("world_size")
    if not isinstance(before_ranks, int) or before_ranks == size:
        return None
    per_rank = manifest.get("batch_size")
    accumulation = manifest.get("grad_accumulation")
    before = (per_rank if isinstance(per_rank, int) else batch_size) * \
        (accumulation if isinstance(accumulation, int) else grad_accumulation) * before_ranks
    return {"from_ranks": before_ranks, "to_ranks": size, "step": step,
            "global_batch_before": before, "global_batch_after": batch_size * grad_accumulation * size,
            "max_steps": max_steps}


def in_words(c: dict) -> str:
    """The change in words: ranks, global batch, and what a step now means for the run's
    length."""
    before, after, max_steps = c["global_batch_before"], c["global_batch_after"], c.get("max_steps")
    text = (f"resumed from {c['from_ranks']} to {c['to_ranks']} ranks at step {c['step']}: "
            f"global batch {before} -> {after} samples per step")
    if before == after:
        return text + "; a step trains as many samples as before"
    if max_steps is not None:
        left = max(0, max_steps - c["step"])
        return text + (f"; train.max_steps {max_steps} counts steps, so the {left} steps left "
                       f"train {left * after} samples, not {left * before}")
    return text + (f"; train.epochs bounds the run, so each epoch still trains every sample "
                   f"once, in {before / after:.3g}x the steps it took before")
