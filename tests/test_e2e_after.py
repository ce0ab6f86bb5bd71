"""A chain on the local Slurm cluster: the digits example trains, and an evaluation job that
names it in `after` starts only once it completed (sbatch --dependency=afterok:JOBID), loads
its last checkpoint and records the test accuracy. Submitting again after the chain ended:
a satisfied dependency is left out, an impossible one refused (exit 2)."""

import json
import shutil
import subprocess

import pytest

from conftest import REPO, follow_job as follow, run_cli
from hpcsuite.runs.rundir import RunDir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLE = REPO / "examples" / "digits"


def test_train_then_evaluate_chain(local_cluster, tmp_path):
    cluster, env = local_cluster
    work = tmp_path / "digits"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    # Held, so the evaluation is submitted while the training surely has not ended.
    train = run_cli("submit", "digits-script-torch.yaml", "--hold", "--set", "train.epochs=3",
                    cwd=work, env=env, check=True).stdout.strip()
    evaluate = run_cli("submit", "digits-eval-torch.yaml", cwd=work, env=env, check=True)
    ev = evaluate.stdout.strip()
    shown = subprocess.run(["scontrol", "show", "job", ev], env=env, capture_output=True,
                           text=True, check=True).stdout
    assert f"Dependency=afterok:{train}" in shown, shown
    pending = json.loads(run_cli("status", ev, "--json", cwd=work, env=env, check=True).stdout)
    assert pending["state"] == "PENDING" and pending["reason"] == "Dependency", pending
    assert "waiting for the job it depends on" in run_cli("status", ev, cwd=work, env=env).stdout

    subprocess.run(["scontrol", "release", train], env=env, check=True)
    assert follow(env, train, work)["state"] == "COMPLETED"
    done = follow(env, ev, work)
    assert done["state"] == "COMPLETED", done
    trained = json.loads((work / "runs" / "digits-script-torch" / train / "results.json").read_text())
    r = json.loads((work / "runs" / "digits-eval-torch" / ev / "results.json").read_text())
    assert r["metrics"]["trained_step"] == trained["final_step"] > 0
    assert r["metrics"]["test_accuracy"] > 0.8
    job = json.loads((work / "runs" / "digits-eval-torch" / ev / "job.json").read_text())
    assert job["after"] == [f"{train}:ok"]             # the name, resolved and recorded
    script = RunDir(work / "runs" / "digits-eval-torch" / ev).script.read_text()
    assert f"#SBATCH --dependency=afterok:{train}\n" in script

    # The training job has completed: nothing to wait for, and no --dependency at all.
    again = run_cli("submit", "digits-eval-torch.yaml", "--wait", cwd=work, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"after: job {train} already completed (COMPLETED): nothing to wait for" in again.stderr
    # It can never fail now: refused before sbatch, one line, exit 2.
    never = run_cli("submit", "digits-eval-torch.yaml", "--after", f"{train}:notok", cwd=work,
                    env=env)
    assert never.returncode == 2, never.stdout + never.stderr
    assert never.stderr.strip().splitlines()[-1] == (
        f"error: --after: {train}:notok: job {train} ended COMPLETED, so the condition 'notok' "
        "(it failed) can never hold")
    unknown = run_cli("submit", "digits-eval-torch.yaml", "--after", "999999", cwd=work, env=env)
    assert unknown.returncode == 2 and "job 999999 is not known to Slurm" in unknown.stderr
