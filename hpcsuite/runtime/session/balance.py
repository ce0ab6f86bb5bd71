"""A rank's side of finding the slow rank (:mod:`hpcsuite.runs.stragglers` is the rule): the
own time and wait it sends with each vote (:mod:`hpcsuite.runtime.rank.vote`), its totals over the attempt for
results.json, and on rank 0 the rule fed with every rank's. Fed by the session's loop (managed
and script mode), beside the vote it rides on."""

from __future__ import annotations

from ...runs.stragglers import MIN_VOTES, PERSISTENCE, RATIO, WINDOW_STEPS, SlowRank


class Balance:
    """One rank's side of it: the own time and wait it sends with each vote, its totals over
    the attempt (for results.json), and on rank 0 the
    :class:`~hpcsuite.runs.stragglers.SlowRank` over every rank's."""

    def __init__(self, backend, rank: int):
        self.b, self.rank = backend, rank
        self.mark = 0               # step_times already reported
        self.posted = 0             # steps the posted vote covers
        self.own = self.wait = 0.0
        self.aside = 0.0            # seconds of the steps spent on the loop's own bookkeeping
        self.steps = 0
        self.watch: SlowRank | None = None
        self.last: dict | None = None   # the newest rank named in this attempt

    def start(self, hosts: list[str]) -> None:
        if self.rank == 0:
            self.watch = SlowRank(hosts)

    def at_vote(self, step_times: list[float]) -> tuple[float | None, float | None]:
        """(own, wait) seconds per step since the previous vote, for this rank's vote."""
        times = step_times[self.mark:]
        self.mark, self.posted = len(step_times), len(times)
        take = getattr(self.b, "take_wait", None)     # a stand-in backend may not time it
        wait = take() if take is not None else None
        aside, self.aside = self.aside, 0.0
        if not times or wait is None:
            return None, None
        own = max(0.0, sum(times) - wait - aside)
        self.own, self.wait, self.steps = self.own + own, self.wait + wait, self.steps + len(times)
        return own / len(times), wait / len(times)

    def read(self, own: tuple, wait: tuple) -> dict | None:
        """Rank 0: the votes' answer in; the rank now named, or None."""
        if self.watch is None:
            return None
        found = self.watch.add(self.posted, own, wait)
        if found:
            self.last = found
        return found

    @property
    def found(self) -> dict | None:
        return self.watch.found if self.watch is not None else None

    def note(self) -> dict:
        """This rank's means over the attempt, for the ranks' gather."""
        n = self.steps
        return {"own_s": self.own / n if n else None, "wait_s": self.wait / n if n else None}

    def record(self, gathered: list[dict]) -> dict:
        """results.json's rank_balance, from every rank's note."""
        return {"own_s": [g.get("own_s") for g in gathered],
                "wait_s": [g.get("wait_s") for g in gathered], "slow_rank": self.last,
                "rule": {"window_steps": WINDOW_STEPS, "ratio": RATIO,
                         "persistence": PERSISTENCE, "min_votes": MIN_VOTES}}
