"""End to end on the local Slurm cluster: `hpcsuite bench allreduce` submits its script-mode
job, both ranks time Horovod's and MPI's allreduce, and the command reads the report back."""

import csv
import json
import time

import pytest

from conftest import REPO, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_bench_allreduce_times_horovod_and_mpi(local_cluster, tmp_path):
    from hpcsuite.alphabeta import AlphaBeta

    _, env = local_cluster
    t0 = time.monotonic()
    proc = run_cli("bench", "allreduce", "--nodes", "2", "--sizes", "4K,256K,4M", "--json",
                   "--budget", "0.2", cwd=tmp_path, env=env, timeout=240)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "COMPLETED"
    run_dir = tmp_path / "runs" / "allreduce-bench" / out["job_id"]
    assert out["run_dir"] == str(run_dir)
    job = json.loads((run_dir / "job.json").read_text())
    assert job["train"]["script"] == str(REPO / "hpcsuite" / "runtime" / "checks" / "allreduce_bench.py")

    r = out["allreduce"]
    assert r == json.loads((run_dir / "allreduce.json").read_text())
    assert r["world_size"] == 2 and sorted(r["hosts"]) == ["node1", "node2"]
    assert r["sizes"] == [4096, 262144, 4194304] and r["job_id"] == out["job_id"]
    assert r["settings"]["horovod_controller"] == "mpi" and r["versions"]["horovod"] == "0.28.1"
    for p, size in zip(r["points"], r["sizes"]):
        assert p["bytes"] == size
        for lib in ("horovod", "mpi"):
            t = p[f"{lib}_s"]
            assert t > 0 and p["iterations"][lib] >= 1
            passes = 2 if lib == "mpi" else 1           # MPI before and after Horovod
            assert len(p["repeats_s"][lib]) == passes * r["settings"]["repeats"]
            assert min(p["repeats_s"][lib]) <= t <= max(p["repeats_s"][lib])
            assert p[f"{lib}_busbw"] == pytest.approx(size / t * 2 * (2 - 1) / 2, rel=1e-12)
        assert p["busbw_ratio"] == pytest.approx(p["horovod_busbw"] / p["mpi_busbw"], rel=1e-12)
        assert len(p["mpi_passes_s"]) == 2 and min(p["mpi_passes_s"]) > 0
    for lib in ("horovod", "mpi"):
        fit = AlphaBeta.from_json(r["fit"][lib])
        assert fit.n == 2 and fit.points == 3 and fit.alpha_s >= 0 and fit.bandwidth_Bps > 0

    with open(run_dir / "allreduce.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["bytes"]) for row in rows] == r["sizes"]
    assert [float(row["mpi_s"]) for row in rows] == [p["mpi_s"] for p in r["points"]]
    assert elapsed < 90, f"the bench took {elapsed:.0f}s"
