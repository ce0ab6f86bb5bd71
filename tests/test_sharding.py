"""The sharding layer: every sample once per epoch, equal steps, resumable cursor."""

import numpy as np
from hypothesis import given, settings, strategies as st

from hpcsuite.runtime.sharding import Cursor, Sharder


def epoch_ids(n, world, batch, seed, epoch=0, accumulation=1, consumed=0):
    """{rank: (ids, weights)} for one epoch from a cursor."""
    out = {}
    for r in range(world):
        s = Sharder(n, world, r, batch, seed, accumulation)
        batches = list(s.epoch(Cursor(epoch, consumed)))
        ids = np.concatenate([b.ids for b in batches]) if batches else np.array([], int)
        w = np.concatenate([b.weights for b in batches]) if batches else np.array([])
        out[r] = (ids, w, len(batches))
    return out


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 6), batch=st.integers(1, 17),
       acc=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 5))
def test_each_sample_exactly_once_and_equal_steps(n, world, batch, acc, seed, epoch):
    out = epoch_ids(n, world, batch, seed, epoch, acc)
    real = np.concatenate([ids[w > 0] for ids, w, _ in out.values()])
    assert sorted(real.tolist()) == list(range(n))
    assert len({steps for _, _, steps in out.values()}) == 1
    assert Sharder(n, world, 0, batch, seed, acc).steps_per_epoch() * acc == out[0][2]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 200), seed=st.integers(0, 1000))
def test_fresh_permutation_each_epoch_and_deterministic(n, seed):
    a0 = epoch_ids(n, 2, 4, seed, epoch=0)[0][0]
    assert np.array_equal(a0, epoch_ids(n, 2, 4, seed, epoch=0)[0][0])
    perms = {tuple(epoch_ids(n, 1, 1, seed, epoch=e)[0][0]) for e in range(4)}
    assert n < 4 or len(perms) > 1


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 5), new_world=st.integers(1, 5),
       batch=st.integers(1, 9), acc=st.integers(1, 3), seed=st.integers(0, 99),
       stop=st.integers(0, 40))
def test_resume_with_other_world_sees_exactly_the_rest(n, world, new_world, batch, acc, seed, stop):
    """Stop after `stop` optimizer steps, resume from the cursor with another world size."""
    seen = []
    cursor = Cursor(0, 0)
    for r in range(world):
        steps = 0
        for b in Sharder(n, world, r, batch, seed, acc).epoch(Cursor(0, 0)):
            if steps >= stop:
                break
            seen += b.ids[b.weights > 0].tolist()
            if b.last_in_step:
                steps += 1
                if r == 0:
                    cursor = b.cursor
    rest = []
    for r in range(new_world):
        for b in Sharder(n, new_world, r, batch, seed, acc).epoch(cursor):
            rest += b.ids[b.weights > 0].tolist()
    assert sorted(seen + rest) == list(range(n))
    assert not set(seen) & set(rest)


def test_step_real_counts_real_samples_of_the_whole_step():
    s = Sharder(10, 2, 1, 3, seed=0)          # global batch 6: steps of 6 and 4 real
    assert [b.step_real for b in s.epoch(Cursor())] == [6, 4]
    assert [int(b.weights.sum()) for b in s.epoch(Cursor())] == [3, 1]
