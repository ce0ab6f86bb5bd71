"""The report's predicted step of each configuration, on fabricated study directories whose
predictions are computed here by hand."""

import csv
import json

import pytest

from hpcsuite.study import points as st
from hpcsuite.study import predicted as sp
from hpcsuite.study import report as sr

# The allocation's benchmark: MPI's fit α = 10 µs, B = 1 GB/s (Horovod's, α = 500 µs, is the
# cycle and must not be used). Gradients: 200 kB in 4 tensors. A 2-rank ring allreduce of all
# of them then takes 2 x 10 µs + 2 x 1/2 x 200e3 / 1e9 = 0.22 ms.
MPI_FIT = {"alpha_s": 10e-6, "bandwidth_Bps": 1e9, "n": 2}
HOROVOD_FIT = {"alpha_s": 500e-6, "bandwidth_Bps": 2e9, "n": 2}
GRADIENT_BYTES = 200_000


def fake(path, configs, mode="weak", fits=(("mpi", MPI_FIT), ("horovod", HOROVOD_FIT)),
         write_job=True, limits=None):
    """A finished study: ``configs`` is a list of (axes, step seconds, batch per rank, job's
    train.horovod, cpus per task); each configuration gets two repeats of that step.
    ``limits`` maps a configuration's index to its no-communication limit's step times, one
    list per rank (each rank's record, rank-R.json), the same in both repeats."""
    limits = limits or {}
    path.mkdir(parents=True)
    axes_keys = {k for axes, *_ in configs for k in axes if k not in ("nodes", "tasks_per_node")}
    axes_yaml = ", ".join(f"{k}: [1]" for k in sorted(axes_keys | {"nodes"}))
    (path / "study.yaml").write_text(f"name: s\nbase: job.yaml\nmode: {mode}\n"
                                     f"axes: {{{axes_yaml}}}\nrepeats: 2\nwarmup_steps: 0\n"
                                     "steps: 10\n")
    points, state = [], {}
    for i, (axes, step, batch, horovod, cpus) in enumerate(configs):
        axes = {"tasks_per_node": 1, **axes}
        ranks = axes["nodes"] * axes["tasks_per_node"]
        for repeat in (0, 1):
            pid = f"p{i:02d}-r{repeat}"
            points.append(st.Point(pid, "train", f"p{i:02d}", axes, repeat, f"s-{pid}"))
            job = str(100 + len(points))
            state[pid] = {"job_id": job, "status": "done", "attempts": 1}
            run = path / "runs" / f"s-{pid}" / job
            run.mkdir(parents=True)
            (run / "results.json").write_text(json.dumps({
                "status": "completed", "step_times_s": [step] * 10,
                "batch_size_per_rank": batch, "world_size": ranks, "grad_accumulation": 1,
                "gradient_bytes": GRADIENT_BYTES, "gradient_tensors": 4}))
            if i in limits:
                lid = f"p{i:02d}L-r{repeat}"
                points.append(st.Point(lid, "limit", f"p{i:02d}", axes, repeat, f"s-{lid}"))
                state[lid] = {"job_id": str(500 + len(points)), "status": "done", "attempts": 1}
                lrun = path / "runs" / f"s-{lid}" / state[lid]["job_id"]
                lrun.mkdir(parents=True)
                (lrun / "results.json").write_text(json.dumps({
                    "status": "completed", "step_times_s": limits[i][0],
                    "batch_size_per_rank": batch, "world_size": ranks,
                    "grad_accumulation": 1}))
                for rank, times in enumerate(limits[i]):
                    (lrun / f"rank-{rank}.json").write_text(json.dumps(
                        {"rank": rank, "step_time_s": times}))
            if write_job:
                (run / "job.json").write_text(json.dumps({
                    "resources": {"nodes": axes["nodes"], "cpus_per_task": cpus},
                    "train": {"horovod": {"cycle_time_ms": 1.0, "fusion_threshold_mb": 64,
                                          "compression": "none", **horovod}}}))
    if fits:
        points.append(st.Point("a00", "allreduce", "a00", {"nodes": 2, "tasks_per_node": 1}, 0,
                               "s-a00"))
        state["a00"] = {"job_id": "999", "status": "done", "attempts": 1}
        (path / "runs" / "s-a00" / "999").mkdir(parents=True)
        (path / "runs" / "s-a00" / "999" / "allreduce.json").write_text(json.dumps({
            "world_size": 2, "fit": dict(fits)}))
    (path / "points.json").write_text(json.dumps({"mode": mode,
                                                  "points": [p.to_json() for p in points]}))
    (path / "state.json").write_text(json.dumps(state))
    (path / "environment.json").write_text(json.dumps({"horovod": "0.28.1"}))
    return st.StudyDir(path)


def rows_by_config(report):
    return {r["config"]: r for r in report["rows"]}


# Two series (cycle 1 ms and 0.5 ms), 1 and 2 nodes; the 1-rank step is 1.2 ms.
# Cycle 1 ms: ready at 1.2 ms after the step starts, 0.22 ms of allreduce: the steps lock to
# the cycle and last ceil(1.42 / 1) = 2 cycles = 2.0 ms; measured 2.1 ms: -4.76 %.
# Cycle 0.5 ms: ceil(1.42 / 0.5) = 3 cycles = 1.5 ms; measured 2.0 ms: -25 %, a miss.
WEAK = [({"horovod.cycle_time_ms": 1, "nodes": 1}, 1.2e-3, 32, {}, 1),
        ({"horovod.cycle_time_ms": 1, "nodes": 2}, 2.1e-3, 32, {}, 1),
        ({"horovod.cycle_time_ms": 0.5, "nodes": 1}, 1.2e-3, 32, {"cycle_time_ms": 0.5}, 1),
        ({"horovod.cycle_time_ms": 0.5, "nodes": 2}, 2.0e-3, 32, {"cycle_time_ms": 0.5}, 1)]


def test_each_point_is_predicted_from_its_1_rank_point_and_the_fitted_allreduce(tmp_path):
    report = sr.analyse(fake(tmp_path / "s", WEAK))
    rows = rows_by_config(report)
    assert rows["p00"]["predicted_step_s"] == pytest.approx(1.2e-3)     # its own compute
    assert rows["p00"]["predicted_error"] == pytest.approx(0.0)
    assert rows["p01"]["predicted_step_s"] == pytest.approx(2.0e-3, rel=1e-9)
    assert rows["p01"]["predicted_error"] == pytest.approx((2.0 - 2.1) / 2.1, rel=1e-9)
    assert rows["p03"]["predicted_step_s"] == pytest.approx(1.5e-3, rel=1e-9)
    assert rows["p03"]["predicted_error"] == pytest.approx(-0.25, rel=1e-9)
    p = rows["p01"]["prediction"]
    assert p["fabric"] == "MPI's allreduce"                 # not Horovod's: its α is the cycle
    assert (p["alpha_s"], p["bandwidth_Bps"], p["backward_fraction"]) == \
        pytest.approx((10e-6, 1e9, 0.0))


def test_a_miss_is_reported_in_the_table_the_summary_csv_and_json(tmp_path):
    sd = fake(tmp_path / "s", WEAK)
    report, paths = sr.write(sd)
    text = (sd.path / "report" / "report.txt").read_text()
    assert ("prediction within ±15% for 3 of 4 points (worst: p03 "
            "(horovod.cycle_time_ms=0.5, 2 rank(s)), -25.0%)") in text
    assert ("outside ±15%: p03 (horovod.cycle_time_ms=0.5, 2 rank(s)): predicted 1.500 ms, "
            "measured 2.000 ms (-25.0%)") in text
    assert ("step model on 2 ranks: MPI's allreduce, alpha 10.0 us per ring step, B 1 GB/s, "
            "no overlap (one core per rank)") in text
    line = next(l for l in text.splitlines() if l.startswith("horovod.cycle_time_ms=0.") and
                l.split()[1] == "2")         # the table's row: measured, predicted, error
    assert line.split()[8:11] == ["2.00", "1.50", "-25.0%"]
    csv_rows = {r["config"]: r for r in csv.DictReader(
        (sd.path / "report" / "report.csv").read_text().splitlines())}
    assert float(csv_rows["p03"]["predicted_step_s"]) == pytest.approx(1.5e-3)
    assert float(csv_rows["p03"]["predicted_error"]) == pytest.approx(-0.25)
    saved = rows_by_config(json.loads((sd.path / "report" / "report.json").read_text()))
    assert saved["p01"]["predicted_error"] == pytest.approx(-0.1 / 2.1)
    assert "job" not in saved["p01"] and "results" not in saved["p01"]


def test_cores_to_spare_let_the_allreduces_hide_under_the_backward_pass(tmp_path):
    # cpus_per_task 2: the backward pass is the last 2/3 of the 1.2 ms step (0.4-1.2 ms), a
    # tensor (50 kB, 20 µs + 50 µs = 0.07 ms) ready every 0.2 ms from 0.6 ms; with no cycle
    # (0 ms) each leaves at once: the last at 1.2 ms, the step ends at 1.27 ms. With one core
    # nothing overlaps: 1.2 + 0.22 = 1.42 ms.
    configs = [({"nodes": 1}, 1.2e-3, 32, {"cycle_time_ms": 0}, 2),
               ({"nodes": 2}, 1.3e-3, 32, {"cycle_time_ms": 0}, 2)]
    two = rows_by_config(sr.analyse(fake(tmp_path / "a", configs)))["p01"]
    assert two["predicted_step_s"] == pytest.approx(1.27e-3, rel=1e-9)
    assert two["prediction"]["backward_fraction"] == pytest.approx(2 / 3)
    one = [(axes, step, batch, horovod, 1) for axes, step, batch, horovod, _ in configs]
    assert rows_by_config(sr.analyse(fake(tmp_path / "b", one)))["p01"]["predicted_step_s"] \
        == pytest.approx(1.42e-3, rel=1e-9)


def test_strong_scaling_scales_the_computation_by_the_per_rank_batch(tmp_path):
    # 1 rank: 64 samples in 2.4 ms; 2 ranks: 32 each, so 1.2 ms of compute, fp16 halving the
    # allreduce to 20 µs + 0.1 ms: ceil(1.32 / 1) = 2 cycles = 2.0 ms.
    configs = [({"nodes": 1}, 2.4e-3, 64, {"compression": "fp16"}, 1),
               ({"nodes": 2}, 2.2e-3, 32, {"compression": "fp16"}, 1)]
    row = rows_by_config(sr.analyse(fake(tmp_path / "s", configs, mode="strong")))["p01"]
    assert row["prediction"]["compute_s"] == pytest.approx(1.2e-3)
    assert row["predicted_step_s"] == pytest.approx(2.0e-3, rel=1e-9)
    # 1.2 ms + 0.12 ms with no cycle at all: fp16 really halved the bytes.
    configs = [(a, s, b, {**h, "cycle_time_ms": 0}, c) for a, s, b, h, c in configs]
    row = rows_by_config(sr.analyse(fake(tmp_path / "t", configs, mode="strong")))["p01"]
    assert row["predicted_step_s"] == pytest.approx(1.32e-3, rel=1e-9)


def test_without_mpis_fit_horovods_bandwidth_is_used_without_its_cycle_alpha(tmp_path):
    # B = 2 GB/s, α left out: 200e3 / 2e9 = 0.1 ms after 1.2 ms of compute, no cycle.
    configs = [({"nodes": 1}, 1.2e-3, 32, {"cycle_time_ms": 0}, 1),
               ({"nodes": 2}, 1.3e-3, 32, {"cycle_time_ms": 0}, 1)]
    row = rows_by_config(sr.analyse(fake(tmp_path / "s", configs,
                                         fits=(("horovod", HOROVOD_FIT),))))["p01"]
    assert row["predicted_step_s"] == pytest.approx(1.3e-3, rel=1e-9)
    assert row["prediction"]["alpha_s"] == 0.0
    assert "Horovod" in row["prediction"]["fabric"]


def test_points_the_study_cannot_predict_are_named_not_dropped(tmp_path):
    # No 1-rank point in the series, and no allreduce benchmark.
    configs = [({"nodes": 2}, 2.0e-3, 32, {}, 1), ({"nodes": 3}, 2.5e-3, 32, {}, 1)]
    report = sr.analyse(fake(tmp_path / "s", configs, fits=()))
    assert [r["predicted_step_s"] for r in report["rows"]] == [None, None]
    text = sr.table(report)
    assert "no prediction for p00 (all, 2 rank(s)): the series has no finished 1-rank point" \
        in text
    configs = [({"nodes": 1}, 1.2e-3, 32, {}, 1), ({"nodes": 2}, 2.0e-3, 32, {}, 1)]
    text = sr.table(sr.analyse(fake(tmp_path / "t", configs, fits=())))
    assert "no prediction for p01 (all, 2 rank(s)): no allreduce benchmark on this allocation" \
        in text
    assert "within ±15% for 1 of 1 points" in text


def test_without_job_json_the_knobs_come_from_the_axes(tmp_path):
    report = sr.analyse(fake(tmp_path / "s", WEAK, write_job=False))
    assert rows_by_config(report)["p03"]["predicted_step_s"] == pytest.approx(1.5e-3, rel=1e-9)


def test_the_summary_line_names_the_worst_point():
    def row(config, error):
        return {"config": config, "series": "all", "ranks": 2, "step_s": {"median": 1.0},
                "predicted_step_s": 1.0 + error, "predicted_error": error,
                "prediction": {"step_s": 1.0 + error, "error": error}}
    lines = sp.summary([row("p01", 0.10), row("p02", -0.15), row("p03", 0.151)])
    assert lines[0] == ("prediction within ±15% for 2 of 3 points "
                        "(worst: p03 (all, 2 rank(s)), +15.1%)")
    assert len(lines) == 2 and "p03" in lines[1]
    flagged = [row("p01", 0.10), {**row("p02", -0.30), "flags": ["repeats spread 1.4x"]}]
    lines = sp.summary(flagged)
    assert lines[1] == ("  of the 1 points the report does not flag: 1 within (a flagged "
                        "point's repeats or limit disagree: its measurement, not the model, is "
                        "in question)")


def test_study_predict_reads_one_per_rank_batch_of_a_study_that_sweeps_it(tmp_path):
    from click.testing import CliRunner

    from hpcsuite.cli import main
    from hpcsuite.errors import UserError
    from hpcsuite.study.predict_io import workload_from_study

    configs = [({"batch_size": 32, "nodes": 1}, 1.2e-3, 32, {}, 1),
               ({"batch_size": 32, "nodes": 2}, 2.1e-3, 32, {}, 1),
               ({"batch_size": 128, "nodes": 1}, 4.0e-3, 128, {}, 1),
               ({"batch_size": 128, "nodes": 2}, 5.0e-3, 128, {}, 1)]
    sd = fake(tmp_path / "s", configs)
    w = workload_from_study(str(sd.path), 0.0)              # the smallest batch, not a mix
    assert (w.step_s, w.batch, w.gradient_bytes, w.tensors) == (1.2e-3, 32, GRADIENT_BYTES, 4)
    assert (workload_from_study(str(sd.path), 0.0, 128).step_s,
            workload_from_study(str(sd.path), 0.0, 128).batch) == (4.0e-3, 128)
    with pytest.raises(UserError, match="measured no point at 64 samples per rank; it measured "
                                        "32, 128"):
        workload_from_study(str(sd.path), 0.0, 64)
    out = CliRunner().invoke(main, ["study", "predict", str(sd.path), "--nodes", "1,2",
                                    "--bandwidth", "1", "--latency", "10", "--batch", "128",
                                    "--backward-fraction", "0", "--json"],
                             env={"HPCSUITE_PROFILE": ""})
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    # 4 ms, then 0.22 ms of allreduce and NCCL's 8.4 µs, which a described fabric pays once
    # per allreduce: 4.2284 ms of work, so steps back to back last ceil(4.2284) = 5 cycles.
    assert result["workload"]["batch"] == 128
    assert result["series"]["current"][1]["step_ms"] == pytest.approx(5.0, rel=1e-9)


def test_the_limit_on_the_points_own_ranks_is_each_ranks_computation(tmp_path):
    # No cycle (0 ms), so a step is its computation + 0.22 ms of allreduce. The 2-rank limit's
    # ranks took 1.0 ms (rank 0) and 1.4 ms (rank 1) a step: each simulated step draws one of
    # the 20 for each rank and waits for the slower, 1.4 ms with probability 3/4:
    # 0.25 x 1.0 + 0.75 x 1.4 + 0.22 = 1.52 ms (sampled: within 2 %). Fed the 1-rank point's
    # 1.2 ms instead: 1.42 ms, exactly.
    configs = [({"nodes": 1}, 1.2e-3, 32, {"cycle_time_ms": 0}, 1),
               ({"nodes": 2}, 1.6e-3, 32, {"cycle_time_ms": 0}, 1)]
    limits = {1: [[1.0e-3] * 10, [1.4e-3] * 10]}
    report = sr.analyse(fake(tmp_path / "s", configs, limits=limits))
    row = rows_by_config(report)["p01"]
    p = row["prediction"]
    assert p["computation"] == "the limit on 2 ranks"
    assert row["predicted_step_s"] == pytest.approx(1.52e-3, rel=0.02)
    assert p["via_1_rank"]["step_s"] == pytest.approx(1.42e-3, rel=1e-9)
    assert p["via_1_rank"]["error"] == pytest.approx((1.42 - 1.6) / 1.6, rel=1e-9)
    # The 1-rank point stays its own computation; the report is the same when read again.
    assert rows_by_config(report)["p00"]["predicted_error"] == pytest.approx(0.0)
    again = rows_by_config(sr.analyse(st.StudyDir(tmp_path / "s")))["p01"]
    assert again["predicted_step_s"] == row["predicted_step_s"]
    text = sr.table(report)
    assert ("computation: the limit on the point's own ranks for 1 point(s) (each rank's step "
            "times; a step waits for the slowest rank)") in text
    assert ("fed the series' 1-rank point instead: within ±15% for 1 of 1 (worst: p01 (all, "
            "2 rank(s)), -11.3%)") in text
    assert "step_times" not in json.dumps(report)


def test_a_limit_without_a_1_rank_point_still_predicts(tmp_path):
    # Only 2 and 3 nodes; the 2-node limit's ranks both 1.3 ms: 1.3 + 0.22 = 1.52 ms exactly.
    configs = [({"nodes": 2}, 1.5e-3, 32, {"cycle_time_ms": 0}, 1),
               ({"nodes": 3}, 2.5e-3, 32, {"cycle_time_ms": 0}, 1)]
    rows = rows_by_config(sr.analyse(fake(tmp_path / "s", configs,
                                          limits={0: [[1.3e-3] * 10, [1.3e-3] * 10]})))
    assert rows["p00"]["predicted_step_s"] == pytest.approx(1.52e-3, rel=1e-9)
    assert "via_1_rank" not in rows["p00"]["prediction"]
    assert rows["p01"]["predicted_step_s"] is None


def test_study_predict_reads_the_overlap_as_the_report_does(tmp_path):
    # One core per rank: the report's step model overlaps nothing, and so does `study predict`
    # of that study unless told otherwise; ranks with cores to spare overlap 2/3 of a step.
    from hpcsuite.study.predict_io import workload_for, workload_from_study

    one = [({"nodes": 1}, 1.2e-3, 32, {}, 1), ({"nodes": 2}, 2.1e-3, 32, {}, 1)]
    four = [({"nodes": 1}, 1.2e-3, 32, {}, 4), ({"nodes": 2}, 2.1e-3, 32, {}, 4)]
    assert workload_from_study(str(fake(tmp_path / "one", one).path), None) \
        .backward_fraction == 0.0
    assert workload_from_study(str(fake(tmp_path / "four", four).path), None) \
        .backward_fraction == pytest.approx(2 / 3)
    assert workload_from_study(str(tmp_path / "one"), 0.5).backward_fraction == 0.5
    assert workload_for(None, 1000, None, 2.0, None, 8, None, None).backward_fraction == \
        pytest.approx(2 / 3)


def test_fabric_measured_is_the_large_allreduces_busbw_and_mpis_latency(tmp_path):
    # The study's own benchmark: MPI at 6 µs per step and 29.5 MB/s from 64 KiB up, but 1 KiB
    # at 36 µs. --fabric measured takes the busbw of 1 MiB and up and the fit's α.
    from click.testing import CliRunner

    from hpcsuite.cli import main
    from hpcsuite.errors import UserError
    from hpcsuite.study.predict_io import measured_fabric

    configs = [({"nodes": 1}, 1.2e-3, 32, {}, 1), ({"nodes": 2}, 2.1e-3, 32, {}, 1)]
    sd = fake(tmp_path / "s", configs)
    sizes = [4 * 4 ** k for k in range(13)]
    rows = [{"bytes": s, "mpi_s": 12e-6 + s / 29.5e6, "horovod_s": 1e-3 + s / 29.5e6}
            for s in sizes]
    rows[4]["mpi_s"] = 36e-6
    rows[-1]["mpi_s"] = rows[-1]["bytes"] / 20e6             # one slow 64 MiB repeat
    bench = sd.path / "runs" / "s-a00" / "999" / "allreduce.json"
    bench.write_text(json.dumps({"world_size": 2, "points": rows}))
    link = measured_fabric(str(sd.path)).inter
    busbw = sorted([20e6] + [s / (12e-6 + s / 29.5e6) for s in sizes[9:12]])   # 1 to 64 MiB
    assert link.bandwidth_Bps == pytest.approx((busbw[1] + busbw[2]) / 2, rel=1e-9)
    assert link.latency_us == pytest.approx(6, rel=0.05)
    out = CliRunner().invoke(main, ["study", "predict", str(sd.path), "--nodes", "1,2",
                                    "--fabric", "measured", "--json"],
                             env={"HPCSUITE_PROFILE": ""})
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["fabric"].startswith(f"measured by {sd.path} on 2 nodes")
    one = fake(tmp_path / "one", configs[:1], fits=())
    with pytest.raises(UserError, match="no finished allreduce benchmark across nodes"):
        measured_fabric(str(one.path))
    out = CliRunner().invoke(main, ["study", "predict", "--params", "1000", "--step-ms", "2",
                                    "--nodes", "1,2", "--fabric", "measured"],
                             env={"HPCSUITE_PROFILE": ""})
    assert out.exit_code == 2 and "measured reads a study's allreduce benchmark" in out.output
