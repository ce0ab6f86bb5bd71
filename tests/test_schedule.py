"""The learning-rate schedule: a function of epochs done, so resumes continue it exactly."""

import math

import pytest

from hpcsuite.runtime.session.schedule import learning_rate
from hpcsuite.submit.spec import Schedule


def rate(progress, world=1, epochs=10, lr=0.1, **kw):
    return learning_rate(Schedule(**kw), lr, world, progress, epochs)


def test_constant_and_linear_scaling():
    assert rate(0.3) == 0.1 and rate(5, world=4) == 0.1
    assert rate(5, world=4, scale_by_world_size=True) == pytest.approx(0.4)


def test_warmup_from_the_single_rank_rate_when_scaling_else_from_zero():
    kw = dict(world=4, scale_by_world_size=True, warmup_epochs=2)
    assert rate(0, **kw) == pytest.approx(0.1)
    assert rate(1, **kw) == pytest.approx(0.25)
    assert rate(2, **kw) == pytest.approx(0.4) and rate(5, **kw) == pytest.approx(0.4)
    assert rate(0, warmup_epochs=2) == 0 and rate(0.5, warmup_epochs=2) == pytest.approx(0.025)


def test_step_and_cosine_decay():
    kw = dict(decay="step", step_epochs=3, gamma=0.5)
    assert [round(rate(e, **kw), 4) for e in (0, 2.9, 3, 6.5, 9)] == [0.1, 0.1, 0.05, 0.025, 0.0125]
    kw = dict(decay="cosine", warmup_epochs=2, min_lr=0.01)
    assert rate(2, **kw) == pytest.approx(0.1)
    assert rate(6, **kw) == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert rate(10, **kw) == pytest.approx(0.01) and rate(12, **kw) == pytest.approx(0.01)


def test_a_resume_on_another_world_size_continues_the_curve():
    """The loop asks for the rate at (epoch + consumed / n): the same point of training gives
    the same rate whatever step count led there."""
    kw = dict(decay="cosine", warmup_epochs=1)
    n = 1000
    two_ranks = {round(e + c / n, 6): rate(e + c / n, **kw) for e in range(3) for c in range(0, n, 100)}
    one_rank = {round(e + c / n, 6): rate(e + c / n, **kw) for e in range(3) for c in range(0, n, 50)}
    for point, value in two_ranks.items():
        assert one_rank[point] == value
