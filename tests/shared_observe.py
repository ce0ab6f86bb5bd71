"""Session-scoped shared end-to-end jobs: the observability job and the preempted script job
(issue 52, point 4). Registered by conftest.py's pytest_plugins.

Each job runs once per session, the first time a test asks for it, and its tests only read it:
a test that runs `hpcsuite report` on one writes the plots to a directory of its own (``--out``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import follow_job, preempt_after_step, run_cli

# ------------------------------------------------------------------ the observability job
# A 2-rank torch job with every observer on, so that the tests of each observer read one job:
# 1111 samples with a tenth held out leave 1000 to train; 2 ranks x 64 make 8 steps an epoch,
# the last one padded (104 real samples of 128). Validation after every epoch, a cosine
# schedule, the monitor with Prometheus textfiles, TensorBoard, and a Horovod timeline window
# over steps 100-150.
OBSERVED_EPOCHS = 120
OBSERVED_STEPS = 8 * OBSERVED_EPOCHS
OBSERVED = f"""name: observed
resources: {{nodes: 2, tasks_per_node: 1, time: "00:10:00"}}
train:
  backend: torch
  model: mlp
  data: {{samples: 1111, shape: [16], classes: 4}}
  batch_size: 64
  epochs: {OBSERVED_EPOCHS}
  lr: 0.05
  eval: {{split: 0.1}}
  schedule: {{decay: cosine}}
  monitor: {{enabled: true, interval_seconds: 0.2, prometheus_dir: prom, tensorboard: true,
            timeline_start_step: 100, timeline_steps: 50}}
"""


@dataclass(frozen=True)
class ObservedJob:
    """A managed job that `submit --wait --json` waited for, as its tests read it."""
    name: str
    work: Path              # where it was submitted from: the CLI's directory for its name
    payload: dict           # what `submit --wait --json` printed
    steps: int | None = None                 # the optimizer steps its spec trains
    seen: tuple[dict, ...] = ()              # progress.json as read while it ran, by step

    @property
    def run_dir(self) -> Path:
        return self.work / self.payload["run_dir"]


def submitted(env: dict, work: Path, name: str, spec_text: str,
              steps: int | None = None) -> ObservedJob:
    """``spec_text`` written to ``work``/NAME.yaml and run with `submit --wait --json` (exit 0):
    a job of a test's own (the TensorFlow cases of the observability job's tests)."""
    (work / f"{name}.yaml").write_text(spec_text)
    out = run_cli("submit", f"{name}.yaml", "--wait", "--json", cwd=work, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return ObservedJob(name, work, json.loads(out.stdout), steps)


@pytest.fixture(scope="session")
def observed_job(local_cluster, tmp_path_factory) -> ObservedJob:
    """The torch observability job (:data:`OBSERVED`), run with `submit --wait --json` while its
    progress.json is read every 0.1 s. The torch case of each of these reads it:
    test_e2e_monitor's test_monitored_job_records_utilisation_and_prometheus and
    test_a_timeline_window_is_copied_next_to_the_results, test_e2e_tensorboard's
    test_a_managed_job_charts_what_results_json_records, test_e2e_live's
    test_live_loss_is_the_global_mean_of_its_step, and test_e2e_ranks's
    test_rank_0s_log_line_is_the_global_mean_loss."""
    _, env = local_cluster
    work = tmp_path_factory.mktemp("observed")
    (work / "observed.yaml").write_text(OBSERVED)
    # Files, not pipes: nobody reads a pipe while the progress is watched.
    with open(work / "submit.out", "w") as out, open(work / "submit.err", "w") as err:
        submit = subprocess.Popen([sys.executable, "-m", "hpcsuite", "submit", "observed.yaml",
                                   "--wait", "--json"], cwd=work, env=env, stdout=out, stderr=err)
        seen = progress_while(submit, work / "runs" / "observed")
    said = (work / "submit.out").read_text()
    assert submit.returncode == 0, said + (work / "submit.err").read_text()
    return ObservedJob("observed", work, json.loads(said), OBSERVED_STEPS, seen)


def progress_while(submit: subprocess.Popen, runs: Path, timeout: float = 600) -> tuple:
    """Every progress.json record read under ``runs`` (a job name's directory) while ``submit``
    waits, and the last one written; by step."""
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while True:
        ended = submit.poll() is not None
        for path in runs.glob("*/progress.json"):
            try:
                record = json.loads(path.read_text())
                seen[record["step"]] = record
            except (OSError, ValueError, KeyError):
                pass                           # between rank 0's writes
        if ended:
            return tuple(seen[step] for step in sorted(seen))
        if time.monotonic() > deadline:
            submit.kill()
            raise AssertionError(f"`submit --wait` still waiting after {timeout}s")
        time.sleep(0.1)


# ------------------------------------------------------------------ the preempted script job
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

# STEPS on one rank (the script uses no Horovod: each rank would be a world of its own), charted
# and tracked: 64 samples / batch 8 = 8 steps an epoch.
PREEMPTED_STEPS = 8 * 40
PREEMPTED_SCRIPT = """name: steps
resources: {nodes: 1, tasks_per_node: 1, time: "00:05:00"}
train:
  script: steps.py
  batch_size: 8
  epochs: 40
  checkpoint: {every_steps: 100000}
  preemption: {signal: USR1, requeue: true}
  monitor: {tensorboard: true}
  tracking: {mlflow: {experiment: preempted}}
"""


@dataclass(frozen=True)
class PreemptedScriptJob:
    work: Path              # where it was submitted from
    job_id: str
    run_dir: Path
    state: dict             # `status --json` once it ended
    # The MLflow run's artifacts when the job ended, before any test's `hpcsuite report` added
    # its plots (report/); None without a run (or without mlflow here).
    mlflow_artifacts: list[str] | None

    @property
    def log(self) -> Path:
        return self.run_dir.parent / f"slurm-{self.job_id}.out"


@pytest.fixture(scope="session")
def preempted_script_job(local_cluster, tmp_path_factory) -> PreemptedScriptJob:
    """:data:`PREEMPTED_SCRIPT`, given the preemption signal once progress.json shows step 5,
    requeued, and followed until it ended. Read by test_whole_run (the whole run reported),
    test_e2e_tensorboard's test_a_requeued_script_job_continues_in_one_log_directory and
    test_e2e_tracking's test_a_preempted_and_requeued_job_continues_one_mlflow_run."""
    cluster, env = local_cluster
    work = tmp_path_factory.mktemp("preempted-script")
    (work / "steps.py").write_text(STEPS)
    (work / "steps.yaml").write_text(PREEMPTED_SCRIPT)
    job_id = run_cli("submit", "steps.yaml", cwd=work, env=env, check=True).stdout.strip()
    run_dir = work / "runs" / "steps" / job_id
    preempt_after_step(env, job_id, run_dir)
    state = follow_job(env, job_id, work, cluster)
    return PreemptedScriptJob(work, job_id, run_dir, state, mlflow_artifacts(run_dir))


def mlflow_artifacts(run_dir: Path) -> list[str] | None:
    """The artifacts of the run directory's MLflow run, through MLflow's own client."""
    record = run_dir / "mlflow.json"
    if not record.is_file() or importlib.util.find_spec("mlflow") is None:
        return None
    from hpcsuite.runs.mlflow_store import client_for     # MlflowClient, file stores allowed

    run = json.loads(record.read_text())
    if not run.get("run_id"):
        return None
    return [f.path for f in client_for(run["uri"]).list_artifacts(run["run_id"])]
