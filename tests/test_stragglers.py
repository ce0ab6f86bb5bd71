"""The slow-rank rule (hpcsuite/runs/stragglers.py) on recorded and synthetic votes, and the
vote's per-rank own time and wait (hpcsuite/runtime/rank/vote.py)."""

from __future__ import annotations

import random

import pytest

from hpcsuite.runs import stragglers
from hpcsuite.runtime.rank import vote
from hpcsuite.runs.stragglers import Sample, SlowRank, behind, finding, line
from hpcsuite.runtime.session.balance import Balance


def reduce_max(vectors):
    return [max(col) for col in zip(*vectors)]


def test_every_rank_gets_every_ranks_own_time_and_wait_through_the_max_vote():
    size = 3
    own = [0.0021, None, 1234.5]
    wait = [0.0005, None, 0.0]
    got = vote.decode(reduce_max([vote.encode(False, False, 10, 1.0, r, size, own[r], wait[r])
                                  for r in range(size)]), size)
    assert got.own == (0.0021, None, 1234.5) and got.wait == (0.0005, None, 0.0)
    assert got.loss_sum == 3.0 and got.interval == 10
    huge = vote.decode(vote.encode(False, False, 1, 0.0, 0, 1, 1e9, float("nan")), 1)
    assert huge.own == ((2 ** 31 - 1) / 1e6,) and huge.wait == (None,)


@pytest.mark.parametrize("own, named", [
    ((1.0, 2.0), [(1, 2.0)]),
    ((1.0, 1.2), []),
    ((1.0, 1.25), [(1, 1.25)]),                 # at the ratio: behind
    ((1.0, 1.0, 1.0, 1.6), [(3, 1.6)]),         # the others' median, not the mean with itself
    ((1.0, None), []),                           # one rank measured: nobody to compare with
    ((0.0, 0.0), []),
])
def test_a_rank_is_behind_at_a_vote_at_the_ratio_over_the_others_median(own, named):
    assert [(r, round(x, 3)) for r, x in behind(own)] == named


def samples(n, steps, own, wait=None):
    return [Sample(steps, tuple(own), tuple(wait or [0.0] * len(own))) for _ in range(n)]


def test_a_rank_slower_all_along_is_named_with_what_it_costs():
    # rank 1 takes 1.6 ms of its own per step, rank 0 1.0 ms and then waits 0.6 ms for it
    found = finding(samples(25, 10, (0.0010, 0.0016), (0.0006, 0.00002)), ["node1", "node2"])
    assert found["rank"] == 1 and found["host"] == "node2" and found["ratio"] == 1.6
    assert found["steps"] == 200 and found["votes"] == 20
    assert found["others_wait"] == pytest.approx(0.0006 / 0.00162, abs=1e-3)
    assert found["cost"] == pytest.approx(0.0006 / 0.00162, abs=1e-3)
    said = line(found)
    assert said.startswith("rank 1 on node2: its own work 1.6x the other ranks' median over the "
                           "last 200 steps; the other ranks wait 37 % of each step")


def test_not_enough_steps_or_votes_names_nobody():
    slow = (0.001, 0.002)
    assert finding(samples(25, 7, slow)) is None              # 175 steps
    assert finding(samples(19, 100, slow)) is None            # 1900 steps but 19 votes
    assert finding(samples(20, 10, slow))["rank"] == 1


def test_a_rank_behind_at_fewer_than_persistence_of_the_votes_is_not_named():
    def window(behind_votes):
        out = samples(behind_votes, 10, (0.001, 0.002)) + \
            samples(20 - behind_votes, 10, (0.001, 0.001))
        random.Random(behind_votes).shuffle(out)
        return out
    assert finding(window(15)) is None
    assert finding(window(16))["rank"] == 1


def test_balanced_noisy_ranks_raise_no_alarm_over_many_windows():
    """Ranks equally fast, each vote's mean own time off by 10 % (a coefficient of variation
    of 55 % per step over a 30-step vote), 2, 8 and 64 ranks: over 2000 votes no window
    names a rank."""
    rng = random.Random(7)
    for size in (2, 8, 64):
        watch = SlowRank()
        for _ in range(2000):
            own = tuple(max(1e-5, rng.gauss(0.001, 0.0001)) for _ in range(size))
            assert watch.add(rng.randint(20, 40), own, (0.0,) * size) is None


def test_the_watch_names_a_rank_once_its_slowness_lasts_and_forgets_it_after():
    watch = SlowRank(["a", "b"])
    for _ in range(20):
        watch.add(25, (0.001, 0.001), (0.0, 0.0))
    assert watch.found is None
    got = [watch.add(25, (0.001, 0.003), (0.002, 0.0)) for _ in range(20)]
    assert got[14] is None and got[15]["rank"] == 1     # 16 of the last 20 votes: 80 %
    for _ in range(10):
        watch.add(25, (0.001, 0.001), (0.0, 0.0))
    assert watch.found is None


class Timed:
    def __init__(self, waits):
        self.waits = list(waits)

    def take_wait(self):
        return self.waits.pop(0)


def test_a_ranks_own_time_is_its_steps_less_its_wait_per_step_and_totalled():
    b = Balance(Timed([0.002, 0.001, None]), 0)
    b.start(["node1", "node2"])
    times = [0.003, 0.003]
    assert b.at_vote(times) == pytest.approx((0.002, 0.001))
    times += [0.004]
    assert b.at_vote(times) == pytest.approx((0.003, 0.001))
    assert b.note() == pytest.approx({"own_s": 0.007 / 3, "wait_s": 0.003 / 3})
    times += [0.001]
    assert b.at_vote(times) == (None, None)              # the backend cannot tell
    assert Balance(object(), 1).at_vote([0.1]) == (None, None)


def test_rank_0_keeps_the_newest_named_rank_for_results():
    b = Balance(Timed([]), 0)
    b.start(["n1", "n2"])
    for _ in range(20):
        b.posted = 25
        b.read((0.001, 0.002), (0.001, 0.0))
    record = b.record([{"own_s": 0.001, "wait_s": 0.001}, {"own_s": 0.002, "wait_s": 0.0}])
    assert record["slow_rank"]["rank"] == 1 and record["own_s"] == [0.001, 0.002]
    assert record["rule"] == {"window_steps": stragglers.WINDOW_STEPS, "ratio": stragglers.RATIO,
                              "persistence": stragglers.PERSISTENCE,
                              "min_votes": stragglers.MIN_VOTES}
    other = Balance(Timed([]), 1)
    other.start(["n1", "n2"])
    assert other.read((0.001, 0.002), (0.0, 0.0)) is None and other.found is None


def test_status_names_the_slow_rank_live_and_from_the_results():
    from types import SimpleNamespace

    from hpcsuite.runner.status import progress_line, slow_rank_lines

    found = finding(samples(20, 25, (0.001, 0.002), (0.001, 0.0)), ["node1", "node2"])
    state = SimpleNamespace(state="RUNNING", elapsed="0:12", reason=None, job_id="5")
    live = progress_line(state, {"step": 300, "slow_rank": found})
    assert live.endswith("| slow: rank 1 on node2 (2.0x)")
    assert "slow" not in progress_line(state, {"step": 300, "slow_rank": None})
    assert slow_rank_lines({"slow_rank": found}, None) == [f"slow rank: {line(found)}"]
    ended = SimpleNamespace(rank_balance={"slow_rank": None})
    assert slow_rank_lines({"slow_rank": found}, ended) == []    # the attempt's own word wins
    assert slow_rank_lines(None, SimpleNamespace(rank_balance={})) == []


def test_small_steps_are_judged_over_the_last_twenty_votes_however_many_steps_they_span():
    """At 2 ms steps a vote comes every ~125 steps: 200 steps hold two votes, so the window
    stretches to the last 20 (~5 s; with 200 steps alone it named nobody ever)."""
    found = finding(samples(25, 125, (0.002, 0.004)))
    assert found["rank"] == 1 and found["votes"] == 20 and found["steps"] == 2500


def test_a_rank_slowed_for_a_second_or_two_is_not_named_one_slowed_for_5_s_is():
    """What named balanced 1-3 ms jobs on this shared VM (docs/BENCHMARKS.md): a rank 1.4x
    the other at 5-8 votes in a row (~2 s), with 70-170 steps a vote. Fed vote by vote."""
    rng = random.Random(11)
    for burst in (5, 8, 12):
        watch = SlowRank()
        for i in range(60):
            slow = 20 <= i < 20 + burst
            own = (rng.gauss(0.0010, 0.00005), rng.gauss(0.0014 if slow else 0.0010, 0.00005))
            assert watch.add(rng.randint(70, 170), own, (0.0, 0.0)) is None, (burst, i)
    watch = SlowRank()
    for i in range(20):
        watch.add(100, (0.0010, 0.0014), (0.0, 0.0))
    assert watch.found["rank"] == 1


def test_the_loops_own_bookkeeping_is_no_ranks_own_work():
    b = Balance(Timed([0.001]), 0)
    b.aside = 0.002                     # rank 0 wrote progress.json and read the vote
    assert b.at_vote([0.004, 0.004]) == pytest.approx((0.0025, 0.0005))
    assert b.aside == 0.0


def test_behind_agrees_with_the_plain_median_of_the_others():
    rng = random.Random(3)
    for n in (2, 3, 4, 7, 64):
        for _ in range(200):
            own = tuple(None if rng.random() < 0.05 else rng.uniform(0.5, 2.0) for _ in range(n))
            known = [(r, t) for r, t in enumerate(own) if t is not None]
            want = []
            if len(known) >= 2:
                import statistics
                for r, t in known:
                    m = statistics.median(x for q, x in known if q != r)
                    if t >= stragglers.RATIO * m:
                        want.append((r, pytest.approx(t / m)))
            assert behind(own) == want
