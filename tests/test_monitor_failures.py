"""A rank that cannot write its Prometheus textfile (issue 51): the run directory records it
(runs/monitor_failures.py) and `status` and `submit --wait` say it, not only the rank's log."""

import json
import logging
from types import SimpleNamespace

import pytest

from hpcsuite import runner
from hpcsuite.runs import jobs, monitor_failures, registry
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe.monitor import Sampler


@pytest.fixture(autouse=True)
def _job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def _state(name="COMPLETED"):
    return jobs.JobState("42", name, "0:0" if name == "COMPLETED" else "", None, None, None,
                         "0:10")


def _run_dir(tmp_path):
    run_dir = tmp_path / "runs" / "d" / "42"
    run_dir.mkdir(parents=True)
    registry.record(tmp_path, {"job_id": "42", "name": "d", "run_dir": str(run_dir)})
    return run_dir


def _unwritable_run(tmp_path, run_dir, rank=0):
    """A rank whose textfile directory turns into a regular file once it started: each write
    is then a path under a regular file (tests run as root, who may write any directory)."""
    prom = tmp_path / "prom"
    sampler = Sampler(10, rank=rank, prometheus_dir=str(prom), job="j", host="node1",
                      run_dir=run_dir)
    prom.rmdir()
    prom.write_text("a file where the directory was\n")
    sampler.start(SimpleNamespace(step=5)).stop()
    return sampler


def test_a_write_failure_is_recorded_and_status_says_it(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    run_dir = _run_dir(tmp_path)
    with caplog.at_level(logging.WARNING):
        sampler = _unwritable_run(tmp_path, run_dir)
    assert sampler.prom_path is None and "not trying again" in caplog.text   # the log, as before
    [said] = monitor_failures.read(run_dir)
    assert said["rank"] == 0 and said["attempt"] == 0 and said["host"] == "node1"
    assert said["error"] == "Not a directory" and said["path"].endswith("-42-rank-0.prom")
    monkeypatch.setattr(jobs, "query", lambda job_id: _state("RUNNING"))
    record = runner.describe("d")
    [line] = [l.strip() for l in record.lines() if "monitor:" in l]
    assert line.startswith("monitor: rank 0 on node1 could not write its Prometheus textfile "
                           "in attempt 0 (")
    assert "-42-rank-0.prom: Not a directory): its metrics are not exported" in line
    assert record.to_json()["monitor"][0]["error"] == "Not a directory"


def test_submit_waits_summary_says_it(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    _unwritable_run(tmp_path, run_dir)
    monkeypatch.setattr(jobs, "query", lambda job_id: _state())
    outcome = runner.wait("42", str(run_dir))
    assert outcome.exit_class == runner.COMPLETED
    lines = outcome.summary().splitlines()
    assert lines[0] == f"job 42 completed; no results.json in {run_dir}"
    assert lines[1].startswith("  monitor: rank 0 on node1 could not write its Prometheus")
    assert outcome.to_json()["monitor"][0]["rank"] == 0


def test_a_stopped_jobs_summary_with_results_says_it_too(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    RunDir(run_dir).results.write_text(json.dumps({"status": "preempted", "final_step": 7}))
    _unwritable_run(tmp_path, run_dir)
    monkeypatch.setattr(jobs, "query", lambda job_id: _state())
    outcome = runner.wait("42", str(run_dir))
    assert outcome.exit_class == runner.STOPPED
    assert outcome.summary().splitlines()[-1].startswith("  monitor: rank 0 on node1 could not")


def test_a_later_attempt_that_writes_its_textfile_clears_the_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = _run_dir(tmp_path)
    _unwritable_run(tmp_path, run_dir)
    assert monitor_failures.read(run_dir)
    (tmp_path / "prom").unlink()              # the directory put right; the job requeued
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    Sampler(10, rank=0, prometheus_dir=str(tmp_path / "prom"), job="j", host="node1",
            run_dir=run_dir).start(SimpleNamespace(step=6)).stop()
    assert monitor_failures.read(run_dir) == []
    monkeypatch.setattr(jobs, "query", lambda job_id: _state("RUNNING"))
    record = runner.describe("d")
    assert not any("monitor:" in l for l in record.lines()) and record.to_json()["monitor"] is None


def test_many_ranks_are_one_line_of_the_latest_attempt(tmp_path):
    for rank in range(6):
        monitor_failures.record(tmp_path, rank, 1, f"node{rank}", f"p/r{rank}.prom", "No space")
    monitor_failures.record(tmp_path, 9, 0, "old", "p/r9.prom", "gone")     # an older world
    assert [r["rank"] for r in monitor_failures.read(tmp_path)] == list(range(6))
    assert monitor_failures.summary_line(tmp_path) == (
        "monitor: ranks 0, 1, 2, 3 and 2 more could not write their Prometheus textfiles in "
        "attempt 1 (rank 0: p/r0.prom: No space): their metrics are not exported; training "
        "does not stop for it")
    RunDir(tmp_path).monitor_failure(3).write_text("{damaged")
    assert [r["rank"] for r in monitor_failures.read(tmp_path)] == [0, 1, 2, 4, 5]


def test_recording_never_raises(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING):
        monitor_failures.record(tmp_path / "file" / "run", 0, 0, "h", "p", "e")
    assert "cannot record the failure" in caplog.text
    assert monitor_failures.summary_line(tmp_path / "nothing") is None
    assert monitor_failures.summary(None) is None
