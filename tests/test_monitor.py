"""The utilisation sampler and its Prometheus textfile (no framework, no MPI)."""

import time
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from hpcsuite.runtime.monitor import Sampler


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
