"""`study predict`'s step model on small cases computed by hand, its fabric presets and the
site profile's `fabric`, and the command's output and refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.fabrics import BASE_LATENCY_US, Fabric, Link, PRESETS, from_profile
from hpcsuite.study.predict import (HELPS, MiB, Knobs, Workload, allreduce_s, allreduces, point,
                                    predict, sampled_step_s, steady_step_s, step_s)

BASE = BASE_LATENCY_US * 1e-6          # 8.4 us, paid once by every allreduce
ONE_GB = Fabric("test", Link(1.0, 0.0))                  # 1 GB/s, no per-step latency
G = 1e9                                                  # gradient bytes (float32)


def test_a_flat_ring_over_two_nodes():
    # 2(N-1)/N * S/B = 2*1/2 * 1e9/1e9 = 1 s; 2 steps cross the network at 10 us: 20 us.
    fabric = Fabric("t", Link(1.0, 10.0))
    assert allreduce_s(G, 2, 1, fabric, False) == pytest.approx(1.0 + 20e-6 + BASE, rel=1e-12)


def test_hierarchical_against_flat_on_two_nodes_of_four():
    fabric = Fabric("t", Link(1.0, 10.0), Link(100.0, 1.0))
    # Flat, 8 GPUs: 2*7/8 * 1e9/1e9 = 1.75 s; of 14 steps 2 cross the network (10 us each),
    # 12 stay inside a node (1 us each): 32 us.
    assert allreduce_s(G, 2, 4, fabric, False) == pytest.approx(1.75 + 32e-6 + BASE, rel=1e-12)
    # Hierarchical: reduce-scatter inside (3/4 * 1e9/1e11 + 3*1 us = 7.503 ms), the ring across
    # 2 nodes (2*1/2 * 1e9/1e9 + 2*10 us = 1.00002 s), allgather inside (7.503 ms again).
    assert allreduce_s(G, 2, 4, fabric, True) == pytest.approx(
        2 * 0.007503 + 1.00002 + BASE, rel=1e-12)


def test_one_gpu_communicates_nothing():
    assert allreduce_s(G, 1, 1, ONE_GB, False) == 0.0
    w = Workload(G, 0.25, 32)
    assert point(w, 1, 1, ONE_GB, Knobs())["efficiency"] == 1.0
    assert point(w, 1, 1, ONE_GB, Knobs())["throughput"] == pytest.approx(32 / 0.25)


def no_overlap(**knobs) -> tuple[Workload, Knobs]:
    """Backward fraction 0: every gradient is ready when the computation (1 s) ends."""
    return (Workload(G, 1.0, 64, backward_fraction=0.0),
            Knobs(**{"cycle_ms": 0.0, "fusion_mb": 4096.0, **knobs}))


def test_no_overlap_adds_the_whole_allreduce():
    # compute 1 s, then one allreduce of 1e9 bytes over 2 ranks at 1 GB/s: 1 s + 8.4 us.
    w, k = no_overlap()
    assert step_s(w, 2, 1, ONE_GB, k) == pytest.approx(2.0 + BASE, rel=1e-12)
    assert point(w, 2, 1, ONE_GB, k)["efficiency"] == pytest.approx(1 / (2.0 + BASE))


def test_fp16_halves_the_bytes():
    # 5e8 bytes at 1 GB/s: 0.5 s after the computation's 1 s.
    w, k = no_overlap(fp16=True)
    assert step_s(w, 2, 1, ONE_GB, k) == pytest.approx(1.5 + BASE, rel=1e-12)


def test_accumulation_exchanges_once_per_k_micro_batches():
    # 4 micro-batches of 1 s, then the same 1 s allreduce: 5 s for 4x the samples.
    w, k = no_overlap(accumulation=4)
    assert step_s(w, 2, 1, ONE_GB, k) == pytest.approx(5.0 + BASE, rel=1e-12)
    assert point(w, 2, 1, ONE_GB, k)["efficiency"] == pytest.approx(4 / (5.0 + BASE))


def test_the_cycle_rounds_the_start_up_to_the_next_tick():
    # Ready at 1.0 s; ticks every 0.3 s: the allreduce starts at 1.2 s, takes 1e8/1e9 = 0.1 s.
    w = Workload(1e8, 1.0, 64, backward_fraction=0.0)
    assert step_s(w, 2, 1, ONE_GB, Knobs(cycle_ms=300.0, fusion_mb=4096.0)) == \
        pytest.approx(1.3 + BASE, rel=1e-12)


def test_the_fusion_threshold_splits_and_each_allreduce_pays_the_latency():
    # A 5e8-byte threshold: two allreduces of 0.5 s each, back to back, after the 1 s.
    w, k = no_overlap(fusion_mb=5e8 / MiB)
    assert step_s(w, 2, 1, ONE_GB, k) == pytest.approx(2.0 + 2 * BASE, rel=1e-12)


def test_fusion_off_sends_each_tensor_alone():
    # 4 tensors of 2.5e8 bytes: 4 allreduces of 0.25 s + 8.4 us each.
    w = Workload(G, 1.0, 64, backward_fraction=0.0, tensors=4)
    assert step_s(w, 2, 1, ONE_GB, Knobs(cycle_ms=0.0, fusion_mb=0.0)) == \
        pytest.approx(2.0 + 4 * BASE, rel=1e-12)


def test_full_overlap_leaves_only_the_last_bucket():
    # Backward is the whole 1 s step; ticks every 0.1 s; at 1000 GB/s each 0.1 s of gradients
    # (1e8 bytes) takes 1e8/1e12 = 0.1 ms: ten allreduces, the last starting at the last tick
    # (1.0 s) and ending 0.1 ms + 8.4 us later.
    fast = Fabric("t", Link(1000.0, 0.0))
    w = Workload(G, 1.0, 64, backward_fraction=1.0)
    k = Knobs(cycle_ms=100.0, fusion_mb=4096.0)
    ops = allreduces(w, 2, 1, fast, k)
    assert len(ops) == 10
    assert [round(start, 9) for start, _, _ in ops] == [round(0.1 * i, 9) for i in range(1, 11)]
    assert step_s(w, 2, 1, fast, k) == pytest.approx(1.0 + 1e-4 + BASE, rel=1e-12)


def test_predict_names_the_best_knob_and_where_efficiency_falls():
    w, k = no_overlap()
    result = predict(w, [1, 2], 1, ONE_GB, k, threshold=0.8)
    # at 2 nodes: now 1/2 s, fp16 1/1.5, accumulation 4: 4/5 -- the most.
    assert result["best_knob"]["knob"] == "accumulation 4"
    assert result["best_knob"]["efficiency"] == pytest.approx(4 / (5.0 + BASE))
    assert result["below_threshold_at_nodes"] == 2
    assert result["series"]["fp16 compression"][1]["efficiency"] == pytest.approx(1 / (1.5 + BASE))


def test_the_presets_follow_their_sources():
    assert PRESETS["ib-edr"] == Link(12.0, 9.6)          # NVIDIA/nccl-tests#119: 12 GB/s per 100G
    assert PRESETS["ib-hdr"] == Link(24.0, 9.6)          # ... 24 GB/s per 200G
    assert PRESETS["25gbe-roce"].bandwidth_GBps == 3.0   # 0.96 x 3.125 GB/s
    assert PRESETS["25gbe-tcp"].bandwidth_GBps == 1.875  # 0.6 x 3.125 GB/s


# ---------------------------------------------------------------------- the command

def run(*args, profile=None):
    env = {"HPCSUITE_PROFILE": str(profile)} if profile else {"HPCSUITE_PROFILE": ""}
    return CliRunner().invoke(main, ["study", "predict", *args], env=env)


def test_the_command_prints_a_table_and_writes_csv_and_png(tmp_path):
    r = run("--params", "23851784", "--throughput", "1420", "--batch", "64", "--nodes",
            "1,2,8", "--gpus-per-node", "4", "--fabric", "25gbe-tcp",
            "--csv", str(tmp_path / "p.csv"), "--png", str(tmp_path / "p.png"))
    assert r.exit_code == 0, r.output
    assert "helps most at 8 nodes" in r.output
    assert (tmp_path / "p.csv").read_text().startswith("setting,nodes,gpus,step_ms")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_command_reads_the_site_profiles_fabric(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("fabric: {bandwidth: 12, latency: 9.6, topology: two-level, "
                       "intra_node: {bandwidth: 230, latency: 3.4}}\n")
    r = run("--params", "1000000", "--step-ms", "100", "--nodes", "2", "--json",
            profile=profile)
    assert r.exit_code == 0, r.output
    assert "two-level" in json.loads(r.output)["fabric"]
    assert from_profile("ib-hdr").inter == PRESETS["ib-hdr"]


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1,x", "--fabric", "ib-hdr", "--params", "5", "--step-ms", "3"],
     "error: --nodes: '1,x' is not a comma-separated list"),
    (["--nodes", "0", "--fabric", "ib-hdr", "--params", "5", "--step-ms", "3"],
     "error: --nodes: '0': each node count"),
    (["--nodes", "2", "--fabric", "ib-hrd", "--params", "5", "--step-ms", "3"],
     "error: --fabric: 'ib-hrd' is not a fabric preset"),
    (["--nodes", "2", "--params", "5", "--step-ms", "3"], "error: --fabric: no fabric"),
    (["--nodes", "2", "--fabric", "ib-hdr", "--step-ms", "3"], "error: --params:"),
    (["--nodes", "2", "--fabric", "ib-hdr", "--params", "5"], "error: --step-ms:"),
    (["--nodes", "2", "--bandwidth", "3", "--params", "5", "--step-ms", "3"],
     "error: --bandwidth: give both"),
    (["--nodes", "2", "--fabric", "ib-hdr", "--params", "5", "--step-ms", "3",
      "--fusion-mb", "0"], "error: --fusion-mb: 0 (fusion off) needs --tensors"),
    (["--nodes", "2", "--fabric", "ib-hdr", "--intra-node", "nvlink", "--params", "5",
      "--step-ms", "3"], "error: --intra-node: 'nvlink' is not a fabric preset"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(*args)
    assert r.exit_code == 2
    assert r.output.strip().startswith(message), r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    ("fabric: ib-hrd", "fabric: 'ib-hrd' is not a fabric preset"),
    ("fabric: {bandwidth: 0}", "fabric.bandwidth: 0.0 is below the minimum"),
    ("fabric: {bandwidht: 3}", "fabric.bandwidht: unknown key"),
    ("fabric: {bandwidth: 3, topology: ring}", "fabric.topology: 'ring' is not one of"),
])
def test_a_bad_site_fabric_names_its_key(tmp_path, text, message):
    profile = tmp_path / "profile.yaml"
    profile.write_text(text + "\n")
    r = run("--params", "5", "--step-ms", "3", "--nodes", "2", profile=profile)
    assert r.exit_code == 2
    assert f"error: {profile}: {message}" in r.output, r.output


def test_a_fitted_fabric_pays_no_base_latency():
    # 1e9 bytes over 2 ranks at 1 GB/s plus 2 ring steps of 10 us: nothing per allreduce.
    fitted = Fabric("fit", Link(1.0, 10.0), base_latency_us=0.0)
    assert allreduce_s(G, 2, 1, fitted, False) == pytest.approx(1.0 + 20e-6, rel=1e-12)


def test_steps_back_to_back_lock_to_the_cycle():
    # Compute 1.2 s, then an allreduce of 0.2 s (2e8 bytes at 1 GB/s), cycle 1 s. The first
    # step starts on a tick: ready at 1.2, sent at the 2.0 tick, done at 2.2 (step_s). The
    # next starts at 2.2, 0.2 s after its cycle began: its ticks fall 0.8, 1.8, ... after its
    # start, so it sends at 1.8 and ends at 2.0: whole cycles from then on.
    w = Workload(2e8, 1.2, 64, backward_fraction=0.0)
    fabric = Fabric("fit", Link(1.0, 0.0), base_latency_us=0.0)
    k = Knobs(cycle_ms=1000.0, fusion_mb=4096.0)
    assert step_s(w, 2, 1, fabric, k) == pytest.approx(2.2, rel=1e-12)
    assert step_s(w, 2, 1, fabric, k, phase_s=0.8) == pytest.approx(2.0, rel=1e-12)
    assert steady_step_s(w, 2, 1, fabric, k) == pytest.approx(2.0, rel=1e-12)
    # A half-second cycle: 1.4 s of work rounds up to 3 cycles.
    assert steady_step_s(w, 2, 1, fabric, Knobs(cycle_ms=500.0, fusion_mb=4096.0)) == \
        pytest.approx(1.5, rel=1e-12)
    # An allreduce longer than a cycle: the next cycle starts when it ends, i.e. with the
    # next step; its gradients wait for the tick after the computation: ceil(1.2) + 1.5.
    long = Workload(1.5e9, 1.2, 64, backward_fraction=0.0)
    assert steady_step_s(long, 2, 1, fabric, k) == pytest.approx(3.5, rel=1e-12)
    # No cycle: the same as one step.
    assert steady_step_s(w, 2, 1, fabric, Knobs(cycle_ms=0.0, fusion_mb=4096.0)) == \
        pytest.approx(1.4, rel=1e-12)


def test_a_varying_computation_waits_for_the_slowest_rank_and_more_cycles():
    fabric = Fabric("fit", Link(1.0, 0.0), base_latency_us=0.0)
    w = Workload(2e8, 1.2, 64, backward_fraction=0.0)
    k = Knobs(cycle_ms=1000.0, fusion_mb=4096.0)
    # One value: exactly the fixed computation's steps back to back.
    assert sampled_step_s(w, [1.2], 2, 1, fabric, k) == steady_step_s(w, 2, 1, fabric, k)
    # No cycle, two ranks each drawing 1 s or 2 s: the slower is 2 s with probability 3/4, so
    # a step is 1.75 + 0.2 s of allreduce on average (2000 sampled steps: within 2 %). One
    # rank: the mean computation, no allreduce.
    none = Knobs(cycle_ms=0.0, fusion_mb=4096.0)
    assert sampled_step_s(w, [1.0, 2.0], 2, 1, fabric, none) == pytest.approx(1.95, rel=0.02)
    assert sampled_step_s(w, [1.0, 2.0], 1, 1, fabric, none) == pytest.approx(1.5, rel=0.02)
    # Four ranks: the slowest of four draws is 2 s with probability 15/16.
    assert sampled_step_s(w, [1.0, 2.0], 4, 1, fabric, none) == pytest.approx(
        1 / 16 + 2 * 15 / 16 + 0.3, rel=0.02)
    # The same draws every time (a report read twice says the same).
    assert sampled_step_s(w, [0.5, 1.7], 2, 1, fabric, k) == \
        sampled_step_s(w, [0.5, 1.7], 2, 1, fabric, k)
    # With the 1 s cycle, computations of 0.6 s or 1.2 s (+ 0.2 s of allreduce) end within 1
    # or 2 whole cycles. One rank has no allreduce and no cycle wait: the mean, 0.9 s. Two
    # ranks: the slower draw is 1.2 s with probability 3/4, so 0.25 x 1 + 0.75 x 2 = 1.75
    # cycles; their mean computation, fixed, would be 2 cycles every step.
    assert sampled_step_s(w, [0.6, 1.2], 1, 1, fabric, k) == pytest.approx(0.9, rel=0.02)
    assert sampled_step_s(w, [0.6, 1.2], 2, 1, fabric, k) == pytest.approx(1.75, rel=0.02)
    assert steady_step_s(Workload(2e8, 0.9, 64, backward_fraction=0.0), 2, 1, fabric, k) == \
        pytest.approx(2.0, rel=1e-12)
    with pytest.raises(ValueError):
        sampled_step_s(w, [], 2, 1, fabric, k)


def test_a_knob_that_gains_next_to_nothing_is_not_named():
    """At full efficiency every knob's gain is a rounding error: the command says no knob
    helps instead of naming one that the table would show as +0.000."""
    w = Workload(G, 1.0, 64)
    result = predict(w, [1, 2], 1, Fabric("fast", Link(1000.0, 0.0)), Knobs())
    gains = [rows[-1]["efficiency"] - result["series"]["current"][-1]["efficiency"]
             for name, rows in result["series"].items() if name != "current"]
    assert 0 < max(gains) < HELPS        # a gain, but one under half a point
    assert result["best_knob"] is None
    r = run("--params", "1000", "--step-ms", "1000", "--nodes", "1,2", "--fabric", "ib-ndr")
    assert r.exit_code == 0, r.output
    assert "no knob tried gains 0.005 or more efficiency at 2 nodes" in r.output
    assert "helps most" not in r.output


def test_a_cycle_sends_everything_ready_at_its_tick_one_allreduce_after_another():
    # Fusion off, 4 tensors ready at 1.0 s, ticks every 0.3 s: the 1.2 s cycle performs all
    # four (0.25 s each), as Horovod's RunLoopOnce performs every response of its list; not one
    # tensor per cycle (which would end at 2.35 s). Measured on the local cluster's shaped
    # link: fusion off 0.998x the fused step, not the 0.91x one tensor per cycle predicted.
    w = Workload(G, 1.0, 64, backward_fraction=0.0, tensors=4)
    k = Knobs(cycle_ms=300.0, fusion_mb=0.0)
    ops = allreduces(w, 2, 1, ONE_GB, k)
    assert [round(start, 9) for start, _, _ in ops] == \
        [round(1.2 + i * (0.25 + BASE), 9) for i in range(4)]
    assert step_s(w, 2, 1, ONE_GB, k) == pytest.approx(2.2 + 4 * BASE, rel=1e-12)
