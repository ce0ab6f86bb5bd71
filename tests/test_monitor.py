"""The utilisation sampler and its Prometheus textfile (no framework, no MPI)."""

import os
import pwd
import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcsuite.runtime.observe.monitor import Sampler

USER = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(autouse=True)
def _cluster(monkeypatch):
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")


def _prom(directory, job_id, rank):
    """Where rank ``rank`` of job ``job_id`` on cluster c1 writes its textfile."""
    return directory / f"hpcsuite-c1-{USER}-{job_id}-rank-{rank}.prom"


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
    text = _prom(tmp_path / "prom", 42, 1).read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"hpcsuite_step", "hpcsuite_cpu_percent", "hpcsuite_rss_bytes"} <= set(families)
    sample = families["hpcsuite_rss_bytes"].samples[0]
    assert sample.labels == {"job": "j", "job_id": "42", "rank": "1", "host": "node2",
                             "cluster": "c1", "user": USER}
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
        text = _prom(tmp_path, 7, rank).read_text()
        families[rank] = {f.name: f.samples[0].value for f in text_string_to_metric_families(text)}
    assert families[0]["hpcsuite_step_own_seconds"] == 0.0016
    assert families[1]["hpcsuite_step_wait_seconds"] == 0.0002
    assert families[0]["hpcsuite_slow_rank"] == 1 and "hpcsuite_slow_rank" not in families[1]
    unknown = Sampler(10, rank=0, prometheus_dir=str(tmp_path / "u"), job="j", host="h")
    unknown.write_prometheus(unknown.sample())          # TensorFlow: not measured, not shown
    text = _prom(tmp_path / "u", 7, 0).read_text()
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
    path = _prom(tmp_path, 9, 0)
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
    ended = _families(_prom(tmp_path, 10, 1))
    assert ended["hpcsuite_step"].samples[0].value == 4
    assert ended["hpcsuite_job_ended"].samples[0].labels["status"] == "failed"
    assert ended["hpcsuite_job_running"].samples[0].value == 0
    sampler.stop("completed")            # a later stop does not rewrite how it ended
    assert _families(_prom(tmp_path, 10, 1))["hpcsuite_job_ended"] \
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
    text = _prom(tmp_path, 11, 0).read_text()
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_textfile_is_named_by_cluster_user_and_job_and_its_labels_say_them(tmp_path,
                                                                              monkeypatch):
    """Issue 51: job ids repeat (a reset Slurm, clusters sharing a directory); the name and
    the labels tell one cluster's and one user's job from another's."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "gpu-west")
    Sampler(10, rank=3, prometheus_dir=str(tmp_path), job="j", host="h").start(
        SimpleNamespace(step=1)).stop()
    [path] = tmp_path.iterdir()
    assert path.name == f"hpcsuite-gpu-west-{USER}-42-rank-3.prom"
    for family in _families(path).values():
        assert all(s.labels["cluster"] == "gpu-west" and s.labels["user"] == USER
                   for s in family.samples)


def test_without_slurms_cluster_name_the_name_says_local_or_unknown(tmp_path, monkeypatch):
    from hpcsuite.runtime.observe.monitor import cluster_name
    from hpcsuite.world import from_env

    monkeypatch.delenv("SLURM_CLUSTER_NAME")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    outside = Sampler(10, rank=0, prometheus_dir=str(tmp_path / "a"), job="j", host="h")
    assert outside.prom_path.name == f"hpcsuite-local-{USER}-local-rank-0.prom"
    assert outside.labels["cluster"] == "local"
    assert cluster_name(from_env({"SLURM_JOB_ID": "5"}, hostname="h")) == "unknown"
    assert from_env({"SLURM_CLUSTER_NAME": "c9"}, hostname="h").cluster == "c9"


def test_the_names_parts_are_kept_safe_as_a_file_name():
    from hpcsuite.runtime.observe.monitor import textfile_name

    assert textfile_name("../c l", "ann/b\n", "7_2", 1) == \
        "hpcsuite-.._c_l-ann_b_-7_2-rank-1.prom"
    assert textfile_name("", "x@corp", "7", 0) == "hpcsuite-_-x@corp-7-rank-0.prom"
    assert len(textfile_name("c" * 300, "u", "7", 0)) < 100


def test_a_stale_file_of_another_user_or_job_does_not_stop_this_jobs_metrics(tmp_path,
                                                                              monkeypatch):
    """A file this job may not replace (as root here: a directory in its way) where the old
    name, another user's name or another job id's name would be: this job writes its own."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    stale = [tmp_path / "hpcsuite-42-rank-0.prom",                  # the old name of job 42
             tmp_path / "hpcsuite-c1-someone-42-rank-0.prom",       # another user's job 42
             tmp_path / "hpcsuite-c2-someone-42-rank-0.prom",       # another cluster's job 42
             _prom(tmp_path, 41, 0)]                                # an older job of this user's
    for path in stale:
        (path / "in-the-way").mkdir(parents=True)
    run_dir = tmp_path / "run"
    progress = SimpleNamespace(step=0)
    sampler = Sampler(0.05, rank=0, prometheus_dir=str(tmp_path), job="j", host="h",
                      run_dir=run_dir).start(progress)
    time.sleep(0.2)
    progress.step = 12
    sampler.stop()
    assert sampler.prom_path == _prom(tmp_path, 42, 0)
    mine = _families(_prom(tmp_path, 42, 0))
    assert mine["hpcsuite_step"].samples[0].value == 12
    assert mine["hpcsuite_job_running"].samples[0].value == 0
    assert all((p / "in-the-way").is_dir() for p in stale)
    assert not (run_dir / "monitor").exists()                       # nothing failed


def test_rank_0_gets_at_most_120_samples_a_rank_the_rank_keeps_them_all():
    """Issue 53, point 3: a sample a second for hours is thinned, evenly, to what results.json
    and the other ranks' charts carry; the first and the last sample are kept."""
    from hpcsuite.runtime.observe.monitor import SHARED_SAMPLES, thinned

    samples = [{"step": i} for i in range(3600)]
    kept = thinned(samples)
    assert len(kept) == SHARED_SAMPLES == 120
    assert kept[0] == samples[0] and kept[-1] == samples[-1]
    steps = [s["step"] for s in kept]
    assert steps == sorted(set(steps)) and max(b - a for a, b in zip(steps, steps[1:])) <= 31
    assert thinned(samples[:50]) == samples[:50] and thinned([]) == []
