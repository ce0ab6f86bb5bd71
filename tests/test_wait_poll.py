"""Following a job to its end (runs/jobs.wait): once the run directory shows the job ending (a
rank's FAILED marker, results.json) Slurm is asked every POLL_FIRST seconds until it says the
job ended, without backing off, so `submit --wait` returns within about POLL_FIRST of Slurm's end."""

import threading
import time

from hpcsuite.runs import jobs
from hpcsuite.runs.jobs import JobState
from hpcsuite.runs.rundir import RunDir


def test_a_job_ending_is_followed_closely_until_slurm_says_it_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "POLL_FIRST", 0.1)
    monkeypatch.setattr(jobs, "POLL_MAX", 10.0)
    t0 = time.monotonic()
    marker_at, end_at = 0.3, 2.8           # seconds after the wait began

    def query(job_id):
        state = "FAILED" if time.monotonic() - t0 >= end_at else "RUNNING"
        return JobState(job_id, state, "1:0" if state == "FAILED" else "0:0", None, None, None)

    monkeypatch.setattr(jobs, "query", query)

    def fail_a_rank():
        time.sleep(marker_at)
        RunDir(tmp_path).failed(0).write_text("rank 1\nexit 1\nRuntimeError: x\n")

    threading.Thread(target=fail_a_rank, daemon=True).start()
    state = jobs.wait("5", run_dir=str(tmp_path))
    late = time.monotonic() - t0 - end_at
    assert state.state == "FAILED"
    # Backing off from the marker on (0.1, 0.15, 0.23, ... s) it would ask at ~3.5 s: 0.7 s late.
    assert late < 0.3, late
