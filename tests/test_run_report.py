"""`hpcsuite report`'s plots from a results file (matplotlib, no cluster)."""

import pytest

from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results
from hpcsuite.runs.report import plot


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


def test_a_requeued_job_plots_every_attempt_with_a_line_where_each_began(tmp_path, monkeypatch):
    import matplotlib.axes

    Results(job="j", job_id="9", attempt=0, status="preempted", world_size=2,
            batch_size_per_rank=8, final_step=30, loss=[3.0 - 0.05 * i for i in range(30)],
            step_times_s=[0.01] * 30, samples_per_s_steady=1600.0).write(tmp_path)
    Results(job="j", job_id="9", attempt=1, world_size=2, batch_size_per_rank=8, start_step=30,
            final_step=60, loss=[1.5 - 0.02 * i for i in range(30)], step_times_s=[0.02] * 30,
            samples_per_s_steady=800.0).write(tmp_path)
    lines, labels = [], {}
    real_axvline, real_set = matplotlib.axes.Axes.axvline, matplotlib.axes.Axes.set

    def axvline(self, x=0, *args, **kwargs):
        lines.append(x)
        return real_axvline(self, x, *args, **kwargs)

    def plot_data(self):
        return [list(line.get_xdata()) for line in self.get_lines()]

    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", axvline)
    seen = []
    real_save = __import__("hpcsuite.runs.report", fromlist=["_save"])._save

    def save(fig, path):
        ax = fig.axes[0]
        seen.append((path.name, ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), plot_data(ax)))
        return real_save(fig, path)

    monkeypatch.setattr("hpcsuite.runs.report._save", save)
    written = plot(tmp_path)
    assert [p.name for p in written] == ["loss.png", "throughput.png"]
    assert lines == [31, 31]                                  # attempt 1 began at step 31
    (name, title, xlabel, ylabel, data), tput = seen
    assert title == "j (job 9), 2 attempts: loss per step"
    assert xlabel == "optimizer step (counted from the job's first)"
    assert ylabel.startswith("loss (per sample)")
    assert data[0][:2] == [1, 2] and data[0][-1] == 60        # the loss from the first step
    assert tput[3] == "samples/s, all ranks (global batch / step time)"
    assert tput[1] == "j (job 9), 2 attempts: throughput, 2 ranks"


def test_script_metrics_are_plotted_and_named(tmp_path):
    Results(job="s", job_id="3", mode="script", loss=[1.0, 0.5], step_times_s=[0.1, 0.1],
            metrics={"loss": [1.0, 0.5], "accuracy": [0.5, 0.75], "test_accuracy": 0.9}).write(tmp_path)
    written = plot(tmp_path)
    assert [p.name for p in written] == ["loss.png", "throughput.png", "metrics.png"]
