"""What a study's numbers rest on (issue 51, point 16): `study predict` computes as each
allocation's own no-communication limit and names the flagged points it reads; a Horovod knob
axis reads its speed-up against its baseline setting; bandwidths keep three significant
figures. On fabricated study directories (tests/test_study_predicted.py's ``fake``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.fabrics import Fabric, Link
from hpcsuite.study import report as sr
from hpcsuite.study.predict import Knobs, Workload, allreduce_s, point
from hpcsuite.study.predicted import gbps
from test_study_predicted import GRADIENT_BYTES, fake, rows_by_config

FIT = Fabric("fit", Link(1.0, 0.0), base_latency_us=0.0)


def predict(path, *args):
    out = CliRunner().invoke(main, ["study", "predict", str(path), "--bandwidth", "1",
                                    "--latency", "10", "--compute-cv", "0", "--cycle-ms", "0",
                                    "--backward-fraction", "0", *args],
                             env={"HPCSUITE_PROFILE": ""})
    assert out.exit_code == 0, out.output
    return out.output


# A weak study on a loaded machine: one rank computes 1.2 ms a step; the 2-node limit's ranks
# took 1.8 ms (1.5x: they fought for the CPU), so its throughput grew 1.33x, not ~2x, and the
# report flags the 2-node configuration.
LOADED = [({"nodes": 1}, 1.2e-3, 32, {"cycle_time_ms": 0}, 1),
          ({"nodes": 2}, 2.1e-3, 32, {"cycle_time_ms": 0}, 1)]
LOADED_LIMITS = {0: [[1.2e-3] * 10], 1: [[1.8e-3] * 10, [1.8e-3] * 10]}


def test_a_rank_computes_as_measured_on_its_allocation_and_efficiency_is_against_one_gpu():
    w = Workload(2e8, 1.0, 8, backward_fraction=0.0)
    # 1 s on one GPU, 1.5 s a rank on 2 nodes: 1.5 s + 0.2 s of allreduce, efficiency 1 / 1.7.
    row = point(w, 2, 1, FIT, Knobs(cycle_ms=0), compute_s=1.5)
    assert row["step_ms"] == pytest.approx(1700.0)
    assert row["efficiency"] == pytest.approx(1 / 1.7)
    assert row["slowest_compute_ms"] == pytest.approx(1500.0)
    assert point(w, 2, 1, FIT, Knobs(cycle_ms=0))["step_ms"] == pytest.approx(1200.0)


def test_study_predict_reads_each_allocations_own_limit(tmp_path):
    sd = fake(tmp_path / "s", LOADED, limits=LOADED_LIMITS)
    result = json.loads(predict(sd.path, "--nodes", "1,2", "--json"))
    w = result["workload"]
    assert w["step_ms"] == pytest.approx(1.2)
    assert w["compute_ms_at_nodes"] == pytest.approx({"1": 1.2, "2": 1.8})
    assert result["compute_from"] == {"1": ["p00"], "2": ["p01"]}
    # 1.8 ms, then the 200 kB allreduce over the described fabric (10 us a ring step and
    # its base latency), against one GPU's 1.2 ms: not 1.2 ms + the allreduce.
    fabric = Fabric("given", Link(1.0, 10.0))
    step = 1.8e-3 + allreduce_s(GRADIENT_BYTES, 2, 1, fabric, False)
    two = result["series"]["current"][1]
    assert two["step_ms"] == pytest.approx(step * 1000, rel=1e-9)
    assert two["efficiency"] == pytest.approx(1.2e-3 / step, rel=1e-9)
    text = predict(sd.path, "--nodes", "1,2,4")
    assert ("compute per micro-batch as the study's no-communication limit measured it there: "
            "1.2 ms on 1 node(s), 1.8 ms on 2 node(s); elsewhere the one-GPU step") in text


def test_study_predict_names_the_flagged_points_it_reads(tmp_path):
    sd = fake(tmp_path / "s", LOADED, limits=LOADED_LIMITS)
    result = json.loads(predict(sd.path, "--nodes", "1,2", "--json"))
    assert [f["config"] for f in result["flagged"]] == ["p01"]
    assert "grew 1.33x from 1 to 2 ranks, not ~2x" in result["flagged"][0]["flags"][0]
    assert result["warnings"] == [
        "warning: this prediction reads p01 (tasks_per_node=1, nodes=2), which the study's "
        "report FLAGGED: " + result["flagged"][0]["flags"][0] + "; what it measured, and so "
        "this prediction, cannot be trusted (run the study again with the nodes to itself)"]
    text = predict(sd.path, "--nodes", "1,2")
    assert text.splitlines()[0] == result["warnings"][0]
    # One node reads only the 1-node points, which are sound.
    assert json.loads(predict(sd.path, "--nodes", "1", "--json"))["flagged"] == []
    # An idle machine: the 2-node limit grew 1.85x; nothing to warn of.
    idle = fake(tmp_path / "idle", LOADED, limits={0: [[1.2e-3] * 10],
                                                   1: [[1.3e-3] * 10, [1.3e-3] * 10]})
    result = json.loads(predict(idle.path, "--nodes", "1,2", "--json"))
    assert result["flagged"] == [] and result["warnings"] == []
    assert "warning" not in predict(idle.path, "--nodes", "1,2")


def knob_study(path, configs, axes: str):
    """``fake``'s study with its axes as given (the fake writes every axis as [1])."""
    sd = fake(path, configs)
    text = (path / "study.yaml").read_text()
    start = text.index("axes: ")
    (path / "study.yaml").write_text(text[:start] + f"axes: {axes}\n"
                                     + text[text.index("\n", start) + 1:])
    return sd


def test_a_horovod_knob_setting_is_read_against_the_axis_first_value(tmp_path):
    # 2 nodes, the fusion threshold swept 64 (the spec's, first), 0 and 128 MB: each setting
    # its own series, and each 1.00 against itself; against 64 MB they are what the knob did.
    configs = [({"horovod.fusion_threshold_mb": mb, "nodes": 2}, step, 32,
                {"fusion_threshold_mb": mb}, 1)
               for mb, step in ((64, 2.0e-3), (0, 2.5e-3), (128, 1.6e-3))]
    sd = knob_study(tmp_path / "s", configs,
                    "{horovod.fusion_threshold_mb: [64, 0, 128], nodes: [2]}")
    report = sr.analyse(sd)
    rows = rows_by_config(report)
    assert [rows[c]["speedup"] for c in ("p00", "p01", "p02")] == \
        pytest.approx([1.0, 0.8, 1.25])
    assert [rows[c]["efficiency"] for c in ("p00", "p01", "p02")] == \
        pytest.approx([1.0, 0.8, 1.25])
    assert {r["speedup_against"] for r in report["rows"]} == {"p00"}
    assert report["baseline"] == {"horovod.fusion_threshold_mb": 64}
    text = sr.table(report)
    assert ("speedup, effic.: against horovod.fusion_threshold_mb=64 (each Horovod knob axis's "
            "first value) at the fewest ranks") in text
    line = next(l for l in text.splitlines() if l.startswith("horovod.fusion_threshold_mb=128"))
    assert line.split()[4:6] == ["1.25", "1.25"]           # speedup, effic.
    assert sr.flat(rows["p01"])["measured_speedup"] == pytest.approx(0.8)


def test_with_nodes_the_baseline_is_its_setting_at_the_fewest_ranks(tmp_path):
    # cycle 1 ms (first) and 5 ms, 1 and 2 nodes; the 1-rank points compute alike, and the
    # 2-node 5 ms point is read against 1 ms on 1 node. A batch axis stays its own series.
    configs = [({"horovod.cycle_time_ms": c, "batch_size": b, "nodes": n}, step, b,
                {"cycle_time_ms": c}, 1)
               for c, b, n, step in ((1, 32, 1, 1.0e-3), (1, 32, 2, 2.0e-3),
                                     (5, 32, 1, 1.25e-3), (5, 32, 2, 5.0e-3),
                                     (1, 64, 1, 2.0e-3), (5, 64, 2, 8.0e-3))]
    sd = knob_study(tmp_path / "s", configs,
                    "{horovod.cycle_time_ms: [1, 5], batch_size: [32, 64], nodes: [1, 2]}")
    rows = rows_by_config(sr.analyse(sd))
    assert rows["p03"]["speedup_against"] == "p00"
    assert rows["p03"]["speedup"] == pytest.approx(2 * 1.0 / 5.0)       # 0.4
    assert rows["p03"]["efficiency"] == pytest.approx(0.2)
    assert rows["p02"]["speedup"] == pytest.approx(0.8)                 # 5 ms on one rank
    assert rows["p05"]["speedup_against"] == "p04"                      # batch 64, cycle 1
    assert rows["p05"]["speedup"] == pytest.approx(2 * 2.0 / 8.0)
    # the flags still read each setting's own limit growth: no limits here, no flags
    assert all(not r["flags"] for r in rows.values())


def test_a_study_without_knob_axes_reads_its_series_as_before(tmp_path):
    configs = [({"nodes": 1}, 1.0e-3, 32, {}, 1), ({"nodes": 2}, 1.6e-3, 32, {}, 1)]
    report = sr.analyse(fake(tmp_path / "s", configs))
    assert report["baseline"] == {}
    assert rows_by_config(report)["p01"]["speedup"] == pytest.approx(2 / 1.6)
    assert "speedup, effic.: against" not in sr.table(report)


@pytest.mark.parametrize("bps, text", [(29.5e6, "0.0295 GB/s"), (1.37e9, "1.37 GB/s"),
                                       (1e9, "1 GB/s"), (111.4e6, "0.111 GB/s"),
                                       (9.996e9, "10 GB/s"), (1234.5e9, "1230 GB/s")])
def test_a_bandwidth_has_three_significant_figures(bps, text):
    assert gbps(bps) == text


def test_the_report_prints_a_slow_links_bandwidth_to_three_figures(tmp_path):
    # 250 Mbit/s: 29.5 MB/s read as "0.03 GB/s" before.
    fits = (("mpi", {"alpha_s": 6e-6, "bandwidth_Bps": 29.5e6, "n": 2}),
            ("horovod", {"alpha_s": 5e-4, "bandwidth_Bps": 29.4e6, "n": 2}))
    configs = [({"nodes": 1}, 1.2e-3, 32, {}, 1), ({"nodes": 2}, 9.0e-3, 32, {}, 1)]
    text = sr.table(sr.analyse(fake(tmp_path / "s", configs, fits=fits)))
    assert "allreduce model on 2x1 (nodes x tasks): alpha 500.0 us, bandwidth 0.0294 GB/s" in text
    assert "alpha 6.0 us per ring step, B 0.0295 GB/s, no overlap" in text
