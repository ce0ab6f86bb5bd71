"""A preempted and requeued job is reported whole, end to end on the local Slurm cluster:
results.json, the summary, `status --json` and `hpcsuite report` cover every attempt, with the
loss from the job's first step and where each attempt began. (The preemption is the one
tests/test_e2e_reliability.py uses: the signal to the batch shell, `scancel --signal=USR1
--batch`, and the requeued job started as soon as the node is idle.)"""

import json

import pytest

from conftest import follow_job, preempt_after_step, run_cli, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# A script-mode job with no framework: 1 rank, 20 ms a step, so the signal lands mid-run.
STEPS = """import time
import numpy as np
from hpcsuite import api

run = api.Run()
restored = run.restore()
w = restored.state["model"]["w"] if restored else np.zeros(1)
for batch in run.batches(64):
    time.sleep(0.02)
    w = w + 1
    run.log(loss=10.0 / run.step, seen=float(w[0]))
    if run.should_stop():
        run.save({"model": {"w": w}})
        break
    if run.checkpoint_due():
        run.save({"model": {"w": w}})
run.finish(params={"w": w})
"""

SPEC = """name: whole
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  script: steps.py
  batch_size: 8
  epochs: 40
  checkpoint: {every_steps: 100000}
  preemption: {signal: USR1, requeue: true}
"""


def test_a_preempted_and_requeued_job_reports_the_loss_from_step_one(local_cluster, tmp_path):
    from hpcsuite.runs.results import Results, describe_run, summarize

    cluster, env = local_cluster
    (tmp_path / "steps.py").write_text(STEPS)
    (tmp_path / "whole.yaml").write_text(SPEC)
    job_id = run_cli("submit", "whole.yaml", cwd=tmp_path, env=env, check=True).stdout.strip()
    run_dir = tmp_path / "runs" / "whole" / job_id
    preempt_after_step(env, job_id, run_dir)
    state = follow_job(env, job_id, tmp_path, cluster)
    log = (tmp_path / "runs" / "whole" / f"slurm-{job_id}.out").read_text()
    assert state["state"] == "COMPLETED", log[-3000:]
    wait_for_text(tmp_path / "runs" / "whole" / f"slurm-{job_id}.out", "requeueing job", 5)

    r = Results.load(run_dir / "results.json")
    total = 40 * 8                                         # 64 samples / batch 8, 40 epochs
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

    status = json.loads(run_cli("status", job_id, "--json", cwd=tmp_path, env=env,
                                check=True).stdout)
    assert [(a["first_step"], a["status"]) for a in status["results"]["attempts"]] == \
        [(1, "preempted"), (cut + 1, "completed")]
    assert status["results"]["attempts"][0]["loss_first"] == 10.0

    out = run_cli("report", job_id, "--out", str(tmp_path / "plots"), cwd=tmp_path, env=env,
                  check=True).stdout.split()
    assert [p.rsplit("/", 1)[-1] for p in out] == ["loss.png", "throughput.png", "metrics.png"]
