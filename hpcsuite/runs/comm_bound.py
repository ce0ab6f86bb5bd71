"""A communication-bound run said as that, without a preflight: every rank spends most of each
step waiting in the gradients' allreduce and none is slow (results.json's rank_balance), so
the network, not a rank, sets the pace. The line gives the share of the step spent waiting,
the bus bandwidth the allreduce's time implies (ring allreduce: 2(n-1)/n of the gradient
bytes cross each rank's link) against the site's fabric, and what finds the slow pair.

Pure: status, report and `submit --wait` print what :func:`line` returns.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# At least this share of every rank's step waiting in the allreduce, and no slow rank: said.
BOUND_SHARE = 0.5


def busbw_GBps(gradient_bytes: int, world: int, seconds: float) -> float | None:
    """The bus bandwidth (GB/s) an allreduce of ``gradient_bytes`` over ``world`` ranks taking
    ``seconds`` implies (nccl-tests' busbw: algbw x 2(n-1)/n)."""
    if world < 2 or seconds <= 0 or gradient_bytes <= 0:
        return None
    return gradient_bytes / seconds * 2 * (world - 1) / world / 1e9


def site_busbw_GBps(run_dir: Path | None) -> float | None:
    """The site's bus bandwidth from the profile the job was submitted under (profile.json's
    fabric: a preset name or its record); None when it names none."""
    from ..fabrics import site_busbw_GBps as from_fabric
    from .rundir import RunDir

    if run_dir is None:
        return None
    try:
        return from_fabric(json.loads(RunDir(run_dir).profile.read_text()).get("fabric"))
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return None


def line(results, run_dir: Path | None = None) -> str | None:
    """The communication-bound line for ``results`` (a Results), or None."""
    balance = results.rank_balance or {}
    own, wait = balance.get("own_s") or [], balance.get("wait_s") or []
    if results.world_size < 2 or len(own) < 2 or len(own) != len(wait) or \
            any(t is None for t in [*own, *wait]):
        return None
    slow = balance.get("slow_rank")
    if isinstance(slow, dict) and slow.get("rank") is not None:
        return None                     # a slow rank sets the pace: said as that
    shares = [w / (o + w) for o, w in zip(own, wait) if o + w > 0]
    if len(shares) != len(own) or min(shares) < BOUND_SHARE:
        return None
    low, high = f"{100 * min(shares):.0f}", f"{100 * max(shares):.0f}"
    text = (f"communication-bound: {low if low == high else f'{low}-{high}'} % of every "
            "rank's step is spent waiting in the gradients' allreduce, and no rank is slow: "
            "the network sets the pace")
    implied = busbw_GBps(results.gradient_bytes, results.world_size, statistics.median(wait))
    if implied is not None:
        text += (f"; the allreduce of {results.gradient_bytes / 1e6:.3g} MB per step implies a "
                 f"bus bandwidth of {implied:.3g} GB/s")
        site = site_busbw_GBps(run_dir)
        if site:
            text += f" against the site fabric's {site:.3g} GB/s ({implied / site:.2g}x)"
    return text + ("; preflight.fabric (min_busbw_gbps) in the spec measures every node pair "
                   "before training and names a slow one")
