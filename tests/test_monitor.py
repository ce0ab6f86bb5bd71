"""The utilisation sampler and its Prometheus textfile (no framework, no MPI)."""

import time
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from hpcsuite.runtime.observe.monitor import Sampler


def test_sampler_records_cpu_memory_and_the_loops_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    progress = SimpleNamespace(step=0)
    sampler = Sampler(0.05, rank=1, prometheus_dir=str(tmp_path / "prom"), job="j",
                      host="node2").start(progress)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:          # busy: the CPU figure must show it
        progress.step += 1
    samples = sampler.stop()
    assert len(samples) >= 5
    assert samples[-1]["step"] == progress.step and samples[0]["step"] <= samples[-1]["step"]
    assert max(s["cpu_percent"] for s in samples) > 30
    assert all(s["rss_bytes"] > 10 * 2**20 for s in samples)
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    text = (tmp_path / "prom" / "hpcsuite-42-rank-1.prom").read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"hpcsuite_step", "hpcsuite_cpu_percent", "hpcsuite_rss_bytes"} <= set(families)
    sample = families["hpcsuite_rss_bytes"].samples[0]
    assert sample.labels == {"job": "j", "job_id": "42", "rank": "1", "host": "node2"}
    assert sample.value > 0


def test_sampler_without_prometheus_writes_nothing(tmp_path):
    sampler = Sampler(0.05, rank=0).start(SimpleNamespace(step=3))
    time.sleep(0.15)
    assert sampler.stop()[-1]["step"] == 3
    assert list(tmp_path.iterdir()) == []


def test_the_textfile_carries_each_ranks_own_time_and_wait_and_rank_0_the_slow_rank(tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for rank, slow in ((0, {"rank": 1}), (1, None)):
        sampler = Sampler(10, rank=rank, prometheus_dir=str(tmp_path), job="j", host="h")
        sampler.balance = (0.0016, 0.0002, slow)
        sampler.write_prometheus(sampler.sample())
    families = {}
    for rank in (0, 1):
        text = (tmp_path / f"hpcsuite-7-rank-{rank}.prom").read_text()
        families[rank] = {f.name: f.samples[0].value for f in text_string_to_metric_families(text)}
    assert families[0]["hpcsuite_step_own_seconds"] == 0.0016
    assert families[1]["hpcsuite_step_wait_seconds"] == 0.0002
    assert families[0]["hpcsuite_slow_rank"] == 1 and "hpcsuite_slow_rank" not in families[1]
    unknown = Sampler(10, rank=0, prometheus_dir=str(tmp_path / "u"), job="j", host="h")
    unknown.write_prometheus(unknown.sample())          # TensorFlow: not measured, not shown
    text = (tmp_path / "u" / "hpcsuite-7-rank-0.prom").read_text()
    assert "hpcsuite_step_own_seconds" not in text and "hpcsuite_slow_rank" not in text


def _families(path):
    """The textfile through prometheus_client's parser (promtool is not on this machine:
    `promtool check metrics` is run where it is, see test_the_end_passes_promtool)."""
    return {f.name: f for f in text_string_to_metric_families(path.read_text())}


def test_the_textfile_ends_with_the_final_values_and_says_the_job_ended(tmp_path, monkeypatch):
    """A finished rank's textfile keeps its last write for ever: that write has the final
    step (not the last interval's) and says the rank ended and how."""
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    progress = SimpleNamespace(step=0)
    sampler = Sampler(0.05, rank=0, prometheus_dir=str(tmp_path), job="j", host="h").start(progress)
    time.sleep(0.2)
    path = tmp_path / "hpcsuite-9-rank-0.prom"
    running = _families(path)
    assert running["hpcsuite_job_running"].samples[0].value == 1
    assert "hpcsuite_job_end_time_seconds" not in running and "hpcsuite_job_ended" not in running
    progress.step = 1500                 # the last steps, after the last interval's sample
    before = time.time()
    sampler.stop("preempted")
    ended = _families(path)
    assert ended["hpcsuite_step"].samples[0].value == 1500
    assert ended["hpcsuite_job_running"].samples[0].value == 0
    assert before <= ended["hpcsuite_job_end_time_seconds"].samples[0].value <= time.time()
    status = ended["hpcsuite_job_ended"].samples[0]
    assert status.labels["status"] == "preempted" and status.value == 1
    time.sleep(0.15)                     # nothing writes after the end
    assert _families(path)["hpcsuite_job_running"].samples[0].value == 0


def test_a_failing_rank_writes_the_end_through_end_all(tmp_path, monkeypatch):
    from hpcsuite.runtime.observe import monitor
    monkeypatch.setenv("SLURM_JOB_ID", "10")
    progress = SimpleNamespace(step=3)
    sampler = Sampler(0.05, rank=1, prometheus_dir=str(tmp_path), job="j", host="h").start(progress)
    time.sleep(0.1)
    progress.step = 4
    monitor.end_all("failed")
    assert sampler not in monitor._ACTIVE
    ended = _families(tmp_path / "hpcsuite-10-rank-1.prom")
    assert ended["hpcsuite_step"].samples[0].value == 4
    assert ended["hpcsuite_job_ended"].samples[0].labels["status"] == "failed"
    assert ended["hpcsuite_job_running"].samples[0].value == 0
    sampler.stop("completed")            # a later stop does not rewrite how it ended
    assert _families(tmp_path / "hpcsuite-10-rank-1.prom")["hpcsuite_job_ended"] \
        .samples[0].labels["status"] == "failed"


def test_the_end_passes_promtool(tmp_path, monkeypatch):
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed here (prometheus_client's parser reads it above)")
    monkeypatch.setenv("SLURM_JOB_ID", "11")
    sampler = Sampler(10, rank=0, prometheus_dir=str(tmp_path), job="j", host="h")
    sampler.balance = (0.001, 0.0002, {"rank": 1})
    sampler.start(SimpleNamespace(step=5)).stop("completed")
    text = (tmp_path / "hpcsuite-11-rank-0.prom").read_text()
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
