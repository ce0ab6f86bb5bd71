"""A preempted and requeued job is reported whole, end to end on the local Slurm cluster:
results.json, the summary, `status --json` and `hpcsuite report` cover every attempt, with the
loss from the job's first step and where each attempt began. The job is the shared preempted
script job of tests/shared_observe.py (preempted the way tests/test_e2e_reliability.py does it:
the signal to the batch shell, `scancel --signal=USR1 --batch`, and the requeued job started as
soon as the node is idle)."""

import json

import pytest

from conftest import run_cli, wait_for_text
from shared_observe import PREEMPTED_STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_preempted_and_requeued_job_reports_the_loss_from_step_one(preempted_script_job,
                                                                     local_cluster, tmp_path):
    from hpcsuite.runs.results import Results, describe_run, summarize

    _, env = local_cluster
    job = preempted_script_job
    job_id, run_dir = job.job_id, job.run_dir
    log = job.log.read_text()
    assert job.state["state"] == "COMPLETED", log[-3000:]
    wait_for_text(job.log, "requeueing job", 5)

    r = Results.load(run_dir / "results.json")
    total = PREEMPTED_STEPS                                # 64 samples / batch 8, 40 epochs
    assert (r.attempt, r.status, r.final_step) == (1, "completed", total)
    cut = r.start_step                                     # where attempt 0 saved and stopped
    assert 5 <= cut < total
    h = r.history
    assert h["steps"] == list(range(1, total + 1))         # from the first step, not from `cut`
    assert h["loss"] == pytest.approx([10.0 / s for s in range(1, total + 1)])
    assert [(a["attempt"], a["step"], a["status"]) for a in h["attempt_starts"]] == \
        [(0, 1, "preempted"), (1, cut + 1, "completed")]
    assert all(v and v > 0 for v in h["samples_per_s"])
    assert [a["first_step"] for a in r.attempts] == [1, cut + 1]

    text = summarize(run_dir)                              # what `submit --wait` prints
    assert f"loss 10.0000 at step 1 -> {10.0 / total:.4f} at step {total}, over 2 attempts " \
           f"(began: attempt 1 at step {cut + 1})" in text, text
    assert f"attempts: 0: preempted at step {cut} (steps 1-{cut}, 1 rank, " in text, text
    assert describe_run(r).startswith("loss 10.0000 at step 1 ")

    status = json.loads(run_cli("status", job_id, "--json", cwd=job.work, env=env,
                                check=True).stdout)
    assert [(a["first_step"], a["status"]) for a in status["results"]["attempts"]] == \
        [(1, "preempted"), (cut + 1, "completed")]
    assert status["results"]["attempts"][0]["loss_first"] == 10.0

    # The plots; report's other lines are the job's TensorBoard files and MLflow run.
    out = run_cli("report", job_id, "--out", str(tmp_path / "plots"), cwd=job.work, env=env,
                  check=True).stdout.splitlines()
    plots = [line for line in out if line.endswith(".png")]
    assert [p.rsplit("/", 1)[-1] for p in plots] == ["loss.png", "throughput.png", "metrics.png"]
