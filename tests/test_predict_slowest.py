"""`study predict`'s slowest rank: the expected largest of N normals against published tables,
the pooled per-rank spread computed by hand, the model at cv 0 against the equal-ranks one,
and the command's `--compute-cv` and the spread's stated source."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.fabrics import Fabric, Link
from hpcsuite.study.predict import (DEFAULT_COMPUTE_CV, Knobs, Workload, expected_max_normal,
                                    point, pooled_cv, predict, slowest_factor, steady_step_s)
from test_study_predicted import fake

ONE_GB = Fabric("fit", Link(1.0, 0.0), base_latency_us=0.0)


@pytest.mark.parametrize("n, expected", [
    (2, 1 / math.sqrt(math.pi)),                                   # exact
    (3, 1.5 / math.sqrt(math.pi)),                                 # exact
    (4, 6 / math.pi ** 1.5 * math.atan(math.sqrt(2))),             # exact
    (5, 1.1629645), (10, 1.5387527), (20, 1.8674750), (100, 2.5075937),   # Harter (1961)
])
def test_the_expected_largest_of_n_normals_matches_its_tables(n, expected):
    assert expected_max_normal(n) == pytest.approx(expected, abs=2e-7)


def test_the_expected_largest_grows_with_n_and_agrees_with_sampling():
    import numpy as np

    assert expected_max_normal(1) == 0.0
    values = [expected_max_normal(n) for n in (1, 2, 8, 64, 512, 4096, 10**6, 10**9)]
    assert values == sorted(values) and len(set(values)) == len(values)
    # 4000 draws of the largest of 512 standard normals: mean 3.04, its error ~0.006.
    largest = np.random.default_rng(0).standard_normal((4000, 512)).max(axis=1)
    assert expected_max_normal(512) == pytest.approx(largest.mean(), abs=0.03)
    assert expected_max_normal(512) == pytest.approx(3.0439, abs=1e-4)
    # Below the sqrt(2 ln n) bound it approaches, even at a billion ranks.
    assert 5.9 < expected_max_normal(10**9) < math.sqrt(2 * math.log(10**9))
    with pytest.raises(ValueError):
        expected_max_normal(0)


def test_the_slowest_factor():
    assert slowest_factor(0.0, 512) == 1.0
    assert slowest_factor(0.05, 1) == 1.0
    assert slowest_factor(0.05, 2) == pytest.approx(1 + 0.05 / math.sqrt(math.pi))
    # Accumulation 4: a step is 4 micro-batches, their sum varies by cv / 2.
    assert slowest_factor(0.05, 2, 4) == pytest.approx(1 + 0.025 / math.sqrt(math.pi))
    for bad in (-0.01, 1.0, float("nan")):
        with pytest.raises(ValueError):
            slowest_factor(bad, 4)


def test_the_pooled_spread_is_each_rank_around_its_own_median():
    # Rank A: median 1, relative deviations 0, 0, 1. Rank B: median 3: 1/3, 0, 1/3. Rank C:
    # one step, left out. The median of the six |deviations| is 1/6; sigma = 1.4826 x 1/6.
    mad = 1.482602218505602
    cv, steps = pooled_cv([[1.0, 1.0, 2.0], [2.0, 3.0, 4.0], [5.0]])
    assert steps == 6
    assert cv == pytest.approx(mad / 6)
    # A rank persistently slower than another is not step-to-step spread.
    assert pooled_cv([[1.0] * 5, [2.0] * 5]) == (0.0, 10)
    # An even count's median is the middle two's mean: [1, 2, 3, 4] -> 2.5; |dev| 0.6, 0.2,
    # 0.2, 0.6, whose median is 0.4.
    assert pooled_cv([[1.0, 2.0, 3.0, 4.0]])[0] == pytest.approx(mad * 0.4)
    # One step 100x the median among 40 does not make the spread: a normal's sigma of the rest.
    steady = [1.0, 1.1, 0.9, 1.05, 0.95] * 8
    assert pooled_cv([steady[:-1] + [100.0]])[0] == pytest.approx(pooled_cv([steady])[0])
    assert pooled_cv([steady])[0] == pytest.approx(mad * 0.05)
    assert pooled_cv([[1.0], [], [0.0, -1.0]]) is None


def test_a_step_waits_for_the_expected_slowest_rank():
    # No overlap, no cycle: 1 s of compute, then 1e8 bytes over 8 ranks at 1 GB/s
    # (2 x 7/8 x 0.1 s = 0.175 s). With cv 0.03 the slowest of 8 computes
    # 1 + 0.03 x e_8 = 1 + 0.03 x 1.4236003 s first.
    w = Workload(1e8, 1.0, 64, backward_fraction=0.0, compute_cv=0.03)
    k = Knobs(cycle_ms=0.0, fusion_mb=4096.0)
    row = point(w, 8, 1, ONE_GB, k)
    slowest = 1 + 0.03 * 1.4236003
    assert row["slowest_compute_ms"] == pytest.approx(slowest * 1000, rel=1e-7)
    assert row["step_ms"] == pytest.approx((slowest + 0.175) * 1000, rel=1e-7)
    assert row["efficiency"] == pytest.approx(1.0 / (slowest + 0.175), rel=1e-7)
    # One GPU is its own mean: no wait, no allreduce.
    assert point(w, 1, 1, ONE_GB, k)["efficiency"] == 1.0


def test_at_cv_0_it_is_the_equal_ranks_model():
    fabric = Fabric("t", Link(3.0, 9.6))
    w = Workload(95e6, 0.45, 64)
    for nodes in (1, 2, 8, 128):
        row = point(w, nodes, 4, fabric, Knobs())
        assert row["step_ms"] == steady_step_s(w, nodes, 4, fabric, Knobs()) * 1000
        assert row["slowest_compute_ms"] == pytest.approx(450.0)


def test_efficiency_falls_with_n_for_a_fixed_spread():
    # A fabric so fast that the allreduce costs nothing measurable: what falls is the wait.
    # (No overlap: with no cycle the model would send the backward pass's bytes as they
    # trickle in, one allreduce per nanosecond-sized share.)
    fast = Fabric("fast", Link(1e6, 0.0), base_latency_us=0.0)
    w = Workload(1e6, 0.1, 64, backward_fraction=0.0, compute_cv=0.02)
    nodes = [1, 2, 4, 16, 64, 256, 1024]
    effs = [r["efficiency"] for r in predict(w, nodes, 8, fast, Knobs(cycle_ms=0.0))
            ["series"]["current"]]
    assert all(a > b for a, b in zip(effs, effs[1:]))
    assert effs[-1] == pytest.approx(1 / (1 + 0.02 * expected_max_normal(8192)), rel=1e-4)
    flat = predict(Workload(1e6, 0.1, 64, backward_fraction=0.0), nodes, 8, fast,
                   Knobs(cycle_ms=0.0))
    assert [r["efficiency"] for r in flat["series"]["current"]] == \
        pytest.approx([1.0] * 7, rel=1e-4)


# ---------------------------------------------------------------------- the command

def run(*args):
    return CliRunner().invoke(main, ["study", "predict", "--params", "23851784",
                                     "--throughput", "142", "--batch", "64", "--nodes", "1,32,128",
                                     "--gpus-per-node", "4", "--fabric", "25gbe-roce", *args],
                              env={"HPCSUITE_PROFILE": ""})


@pytest.mark.parametrize("value", ["-0.01", "1", "1.5", "abc", "nan", "inf", ""])
def test_a_bad_compute_cv_is_one_line_and_exit_2(value):
    r = run("--compute-cv", value)
    assert r.exit_code == 2
    assert r.output.strip().startswith(f"error: --compute-cv: {value!r} is not a number at "
                                       "least 0 and under 1"), r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_command_states_the_spread_and_its_source():
    given = run("--compute-cv", "0.03", "--json")
    assert given.exit_code == 0, given.output
    result = json.loads(given.output)
    assert result["workload"]["compute_cv"] == 0.03
    assert result["workload"]["compute_cv_source"] == "given (--compute-cv)"
    last = result["series"]["current"][-1]
    assert last["slowest_compute_ms"] == pytest.approx(
        64 / 142 * 1000 * (1 + 0.03 * expected_max_normal(512)))
    default = run()
    assert default.exit_code == 0, default.output
    assert f"per-rank compute spread: cv {DEFAULT_COMPUTE_CV:.4f} per step, default: " \
        "8 % variation among GPUs of one SKU (Sinha et al., arXiv:2208.11035v3)" in \
        default.output
    assert "a step waits for the slowest GPU's compute: " in default.output
    # cv 0 is the model of every rank equally fast.
    zero = json.loads(run("--compute-cv", "0", "--json").output)["series"]["current"]
    w = Workload(23851784 * 4.0, 64 / 142, 64)
    assert [r["step_ms"] for r in zero] == [
        steady_step_s(w, n, 4, Fabric("25gbe-roce", Link(3.0, 9.6)), Knobs()) * 1000
        for n in (1, 32, 128)]


def test_a_study_gives_its_ranks_measured_spread(tmp_path):
    # The 2-rank limit's ranks: rank 0 steps 1.0 and 1.2 ms (median 1.1), rank 1 1.3 and 1.5
    # ms (median 1.4); the 1-rank point's steps are all 1.2 ms. Pooled: 20 + 20 + 20 steps (two
    # repeats of the limit, the 1-rank point's two repeats): 20 deviations of 1/11, 20 of
    # 1/14, 20 of 0, whose median is 1/14.
    rank0, rank1 = [1.0e-3, 1.2e-3] * 5, [1.3e-3, 1.5e-3] * 5
    configs = [({"nodes": 1}, 1.2e-3, 32, {}, 1), ({"nodes": 2}, 1.6e-3, 32, {}, 1)]
    sd = fake(tmp_path / "s", configs, limits={1: [rank0, rank1]})
    r = CliRunner().invoke(main, ["study", "predict", str(sd.path), "--nodes", "1,2,64",
                                  "--bandwidth", "1", "--latency", "10", "--json"],
                           env={"HPCSUITE_PROFILE": ""})
    assert r.exit_code == 0, r.output
    w = json.loads(r.output)["workload"]
    assert w["compute_cv"] == pytest.approx(1.482602218505602 / 14)
    assert w["compute_cv_source"] == ("measured: 60 steps of 6 rank(s) in 4 point(s) of the "
                                      "study, each rank around its own median")
    # Given, the option wins over the measurement.
    r = CliRunner().invoke(main, ["study", "predict", str(sd.path), "--nodes", "1,2",
                                  "--bandwidth", "1", "--latency", "10", "--compute-cv", "0",
                                  "--json"], env={"HPCSUITE_PROFILE": ""})
    assert json.loads(r.output)["workload"]["compute_cv"] == 0.0


def test_study_predict_stays_a_login_node_command():
    """The slowest rank's arithmetic is the standard library's: a whole prediction imports no
    framework, and not numpy either."""
    import os
    import subprocess
    import sys

    from test_imports import PROBE

    out = subprocess.run([sys.executable, "-c", PROBE, "study", "predict", "--params", "1000",
                          "--step-ms", "10", "--nodes", "1,64", "--fabric", "ib-hdr"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HPCSUITE_PROFILE": ""})
    assert "a step waits for the slowest GPU's compute" in out.stdout, out.stderr
    assert "HEAVY=[]" in out.stdout
