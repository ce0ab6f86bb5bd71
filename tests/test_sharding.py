"""The sharding layer: every sample once per epoch, equal steps, resumable cursor."""

import numpy as np
from hypothesis import given, settings, strategies as st

from hpcsuite.runtime.input.sharding import Cursor, Sharder


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


def _reference_epoch(s: Sharder, cursor: Cursor):
    """The sharding rule written out one micro-batch at a time (the layer computes blocks)."""
    perm = np.random.default_rng([s.seed, cursor.epoch]).permutation(s.n)
    micro = s.world * s.batch
    step_start = cursor.consumed
    while step_start < s.n:
        step_real = min(s.n - step_start, s.step_slots)
        for k in range(s.accumulation):
            start = step_start + k * micro + s.rank * s.batch
            slots = np.arange(start, start + s.batch)
            real = slots < s.n
            ids = perm[np.where(real, slots, slots % s.n)]
            order = np.argsort(ids, kind="stable")
            last = k == s.accumulation - 1
            yield (ids[order].tolist(), real[order].astype(np.float32).tolist(), int(real.sum()),
                   step_real, last, (cursor.epoch, min(step_start + s.step_slots, s.n) if last else step_start))
        step_start += s.step_slots


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), world=st.integers(1, 5), batch=st.integers(1, 9),
       acc=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 3),
       skip=st.integers(0, 50), block=st.sampled_from([1, 2, 7, 256]))
def test_block_computation_matches_the_rule_batch_by_batch(n, world, batch, acc, seed, epoch,
                                                           skip, block):
    for rank in range(world):
        s = Sharder(n, world, rank, batch, seed, acc)
        s.BLOCK_STEPS = block
        consumed = min(skip * s.step_slots, n)
        got = [(b.ids.tolist(), b.weights.tolist(), b.real, b.step_real, b.last_in_step,
                (b.cursor.epoch, b.cursor.consumed)) for b in s.epoch(Cursor(epoch, consumed))]
        assert got == list(_reference_epoch(s, Cursor(epoch, consumed)))
