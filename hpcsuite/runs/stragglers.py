"""Which rank the others wait for: the rule rank 0 applies to the ranks' votes.

At each vote every rank reports how its steps since its previous vote split (:mod:`.vote`): its
own time per step (data, forward, backward, optimizer: all but the wait for the others) and its
wait in the gradients' allreduce. In a synchronous step the slowest rank's own time sets the
pace: the others finish early and wait for it. The rule, over the votes that cover the last
WINDOW_STEPS steps, and at least the last MIN_VOTES votes. Votes come about every 0.25 s, so
the window spans at least ~5 s: steps of a few ms put thousands of steps in it, and a rank that
a shared core slows for a second or two (1.4x at 5 votes in a row, measured on balanced 1-3 ms
steps, docs/BENCHMARKS.md) is not named, while a node slower all along still is:

- a rank is behind at a vote when its own time is at least RATIO x the median of the other
  ranks' own times at that vote;
- it is named when it was behind at PERSISTENCE (80 %) or more of those votes: a rank held up
  by one slow save or one page fault is not named, a node that is slower all along is;
- what it costs: the step would be shorter by its own time less the others' median, a share
  of the mean step time the ranks measured (the throughput the job loses), and the others'
  wait is their median wait's share of the step.

Pure: the session feeds it votes; status, report and the live line print what it returns.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

WINDOW_STEPS = 200
MIN_VOTES = 20
RATIO = 1.25
PERSISTENCE = 0.8


@dataclass(frozen=True)
class Sample:
    steps: int            # steps this vote covers
    own: tuple            # each rank's own seconds per step (None: not measured)
    wait: tuple           # each rank's wait seconds per step (None: not measured)
    late: tuple | None = None   # behind(own), worked out once when the vote came in


def behind(own: tuple) -> list[tuple[int, float]]:
    """(rank, own / median of the others' own) for each rank at or above RATIO at one vote.
    One sort per vote: rank 0 runs this for every rank at every vote (1,000 ranks: ~1 ms)."""
    known = sorted((t, r) for r, t in enumerate(own) if t is not None)
    n = len(known)
    if n < 2:
        return []

    def others_at(j: int, i: int) -> float:      # the j-th of the others, rank at i left out
        return known[j if j < i else j + 1][0]

    out = []
    m = n - 1                                    # the others
    for i in range(n - 1, -1, -1):               # the slowest first: stop at the first not behind
        mine, rank = known[i]
        median = others_at(m // 2, i) if m % 2 else \
            (others_at(m // 2 - 1, i) + others_at(m // 2, i)) / 2
        if median <= 0 or mine < RATIO * median:
            break
        out.append((rank, mine / median))
    return sorted(out)


def finding(samples: list[Sample], hosts: list[str] | None = None) -> dict | None:
    """The rank named over ``samples`` (the newest last), or None; see the module's rule."""
    window, steps = [], 0
    for s in reversed(samples):
        if steps >= WINDOW_STEPS and len(window) >= MIN_VOTES:
            break
        window.append(s)
        steps += s.steps
    if len(window) < MIN_VOTES or steps < WINDOW_STEPS:
        return None
    counts: dict[int, list[float]] = {}
    for s in window:
        for rank, ratio in (s.late if s.late is not None else behind(s.own)):
            counts.setdefault(rank, []).append(ratio)
    named = [(len(r), rank) for rank, r in counts.items() if len(r) >= PERSISTENCE * len(window)]
    if not named:
        return None
    _, rank = max(named)
    return _describe(rank, counts[rank], window, steps, hosts)


def _describe(rank: int, ratios: list[float], window: list[Sample], steps: int,
              hosts: list[str] | None) -> dict:
    gained, step, others_wait = [], [], []
    for s in window:
        others = [t for r, t in enumerate(s.own) if r != rank and t is not None]
        mine = s.own[rank]
        waits = [w for r, w in enumerate(s.wait) if r != rank and w is not None]
        if not others or mine is None:
            continue
        total = mine + (s.wait[rank] or 0.0)      # the slow rank barely waits: its step is the step
        step.append(total)
        gained.append(max(0.0, mine - statistics.median(others)))
        if waits:
            others_wait.append(statistics.median(waits) / max(total, 1e-12))
    mean_step = statistics.fmean(step) if step else 0.0
    return {"rank": rank, "host": hosts[rank] if hosts and rank < len(hosts) else None,
            "ratio": round(statistics.median(ratios), 3), "steps": steps, "votes": len(window),
            "others_wait": round(statistics.fmean(others_wait), 3) if others_wait else None,
            "cost": round(statistics.fmean(gained) / mean_step, 3) if mean_step else None}


def line(found: dict) -> str:
    """One line for status, the live line and the report."""
    where = f"rank {found['rank']}" + (f" on {found['host']}" if found.get("host") else "")
    said = [f"{where}: its own work {found['ratio']:.1f}x the other ranks' median over the last "
            f"{found['steps']} steps"]
    if found.get("others_wait") is not None:
        said.append(f"the other ranks wait {100 * found['others_wait']:.0f} % of each step")
    if found.get("cost"):
        said.append(f"it costs about {100 * found['cost']:.0f} % of the throughput")
    return "; ".join(said)


class SlowRank:
    """Rank 0's recent votes (bounded) and the rank they name now, if any."""

    def __init__(self, hosts: list[str] | None = None):
        # a vote covers one step or more: WINDOW_STEPS votes always span the window
        self.samples: deque[Sample] = deque(maxlen=WINDOW_STEPS)
        self.hosts = hosts
        self.found: dict | None = None

    def add(self, steps: int, own: tuple, wait: tuple) -> dict | None:
        if steps <= 0 or not own:
            return self.found
        self.samples.append(Sample(steps, tuple(own), tuple(wait), tuple(behind(own))))
        self.found = finding(list(self.samples), self.hosts)
        return self.found
