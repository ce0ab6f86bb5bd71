"""A study point's status after a refresh: done only once its results are complete and Slurm
has let its job go (a job still ending holds its nodes, and `study run --wait` must not return
under it)."""

import pytest

from hpcsuite.study.points import MAX_ATTEMPTS
from hpcsuite.study.run import verdict


@pytest.mark.parametrize("finished, complete, attempts, expected", [
    (False, True, 1, None),             # results written, the job still ending: in flight
    (False, False, 1, None),            # still training
    (True, True, 1, "done"),
    (True, True, MAX_ATTEMPTS, "done"),
    (True, False, 1, "retry"),          # ended without complete results
    (True, False, MAX_ATTEMPTS, "failed"),
])
def test_a_point_is_done_only_when_its_results_are_complete_and_its_job_has_ended(
        finished, complete, attempts, expected):
    assert verdict(finished, complete, attempts) == expected
