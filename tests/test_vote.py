"""The ranks' vote: one int32 Max allreduce carries stop, save, interval and each rank's loss."""

import math

import numpy as np
import pytest

from hpcsuite.runtime.rank import vote
def reduce_max(vectors):
    return np.max(np.array(vectors, dtype=np.int64), axis=0).tolist()


@pytest.mark.parametrize("losses", [[1.5, 2.25], [0.1, -3.0, 7e-12, 1e300], [-0.0, 0.0],
                                    [0.7]])
def test_max_of_the_ranks_vectors_sums_their_losses_exactly(losses):
    size = len(losses)
    vectors = [vote.encode(rank == 0, False, 10 + rank, loss, rank, size)
               for rank, loss in enumerate(losses)]
    assert all(len(v) == vote.length(size) for v in vectors)
    assert all(-2 ** 31 <= x < 2 ** 31 for v in vectors for x in v)   # fits int32
    got = vote.decode(reduce_max(vectors), size)
    assert got.stop and not got.save
    assert got.interval == 10                     # the smallest proposal
    assert got.loss_sum == sum(losses)


def test_nan_loss_stays_nan_and_save_is_any():
    vectors = [vote.encode(False, rank == 1, 5, math.nan if rank == 0 else 1.0, rank, 2)
               for rank in range(2)]
    got = vote.decode(reduce_max(vectors), 2)
    assert math.isnan(got.loss_sum) and got.save and not got.stop
