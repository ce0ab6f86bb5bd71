"""`hpcsuite report`'s plots from a results file (matplotlib, no cluster)."""

import pytest

from hpcsuite.errors import UserError
from hpcsuite.results import Results
from hpcsuite.run_report import plot


def test_plots_loss_throughput_and_utilisation(tmp_path):
    n = 60
    r = Results(job="j", job_id="5", world_size=2, batch_size_per_rank=32, steps=n, final_step=n,
                loss=[2.0 / (i + 1) for i in range(n)], step_times_s=[0.01] * n,
                eval=[{"epoch": 1, "step": 30, "loss": 0.2, "accuracy": 0.9, "samples": 10}],
                utilisation=[[{"t": 0.5 * i, "step": i, "cpu_percent": 90.0, "rss_bytes": 2**28}
                              for i in range(10)] for _ in range(2)])
    r.write(tmp_path)
    written = plot(tmp_path, tmp_path / "plots")
    assert [p.name for p in written] == ["loss.png", "throughput.png", "utilisation.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 5000 for p in written)
    r.utilisation = []
    r.write(tmp_path)
    assert [p.name for p in plot(tmp_path)] == ["loss.png", "throughput.png"]


def test_no_results_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="results.json: no results yet"):
        plot(tmp_path)
