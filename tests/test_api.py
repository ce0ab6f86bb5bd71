"""hpcsuite.api in one process (no MPI): the sharding, checkpoints, stop flag and results a
script-mode job gets. tests/test_e2e_user.py runs it on 2 ranks through Slurm."""

import json
from pathlib import Path

import numpy as np
import pytest

from hpcsuite import api
from hpcsuite.errors import UserError
from hpcsuite.runs.results import Results
from hpcsuite.runtime.rank.signals import StopFlag
from hpcsuite.submit.spec import spec_from_dict


def make_run(tmp_path, **train):
    job = spec_from_dict({"name": "s", "train": {"script": "train.py", "batch_size": 4, "epochs": 2,
                                                 "checkpoint": {"every_steps": 3}, **train}}, "t")
    run_dir = tmp_path / "runs" / "s" / "1"
    run_dir.mkdir(parents=True, exist_ok=True)
    return api.Run(None, job=job, run_dir=run_dir)


def test_batches_cover_every_sample_once_per_epoch(tmp_path):
    run = make_run(tmp_path)
    seen = {0: [], 1: []}
    for batch in run.batches(10):
        seen[batch.cursor.epoch if batch.cursor.consumed < 10 else batch.cursor.epoch].extend(
            batch.ids[batch.weights > 0].tolist())
        run.log(loss=1.0)
    assert sorted(seen[0]) == list(range(10)) and sorted(seen[1]) == list(range(10))
    assert run.step == 6 and run.epoch == 2


def test_save_restore_continues_where_it_stopped(tmp_path):
    run = make_run(tmp_path)
    done = []
    for batch in run.batches(10):
        done.extend(batch.ids[batch.weights > 0].tolist())
        if run.checkpoint_due():
            run.save({"model": {"w": np.full(3, run.step, np.float32)}}, extra={"note": "hi"})
            break
    assert run.step == 3
    again = make_run(tmp_path)
    restored = again.restore()
    assert restored.step == 3 and restored.extra == {"note": "hi"}
    assert restored.state["model"]["w"].tolist() == [3, 3, 3]
    for batch in again.batches(10):
        done.extend(batch.ids[batch.weights > 0].tolist())
    assert sorted(done) == sorted(list(range(10)) * 2) and again.step == 6


def test_a_checkpoint_of_another_script_is_refused(tmp_path):
    run = make_run(tmp_path)
    next(iter(run.batches(10)))
    run.save({"w": np.zeros(1)})
    with pytest.raises(UserError, match="written by train.script 'train.py'"):
        make_run(tmp_path, script="other.py").restore()


def test_stop_flag_finish_and_results(tmp_path):
    run = make_run(tmp_path, checkpoint={"every_steps": 0})
    run._flag = StopFlag()
    run.vote_seconds = 1e-9                       # vote at every step
    for batch in run.batches(30):
        run.log(loss=0.5, acc=0.9)
        if run.step == 3:
            run._flag.raise_("USR1")              # what the handler does
        if run.should_stop():
            run.save({"w": np.ones(2)})
            break
    assert run.step == 3                          # the step the signal came in
    run.finish(params={"w": np.ones(2)}, final_score=3)
    r = Results.load(run.run_dir / "results.json")
    assert (r.mode, r.status, r.final_step, r.loss) == ("script", "preempted", 3, [0.5] * 3)
    assert r.metrics == {"loss": [0.5] * 3, "acc": [0.9] * 3, "final_score": 3}
    assert len(r.param_checksums) == 1
    assert (run.run_dir / "PREEMPTED").read_text() == "3 signal\n"
    assert json.loads((run.run_dir / "rank-0.json").read_text())["steps"] == 3


def test_a_retired_flag_ignores_a_late_signal():
    """After a rank's work is recorded, a preemption signal must not kill it during shutdown
    (Python's finalization would restore the default action, terminate)."""
    import subprocess
    import sys

    code = ("import os, signal\n"
            "from hpcsuite.runtime.rank.signals import FLAG\n"
            "FLAG.install(['USR1', 'TERM'])\n"
            "FLAG.retire()\n"
            "assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN\n"
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "print('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr


def test_logged_values_are_the_metrics_the_readme_names(tmp_path):
    """README: in script mode results.json has the script's own numbers in `metrics`; the
    loss is there too (and in `loss`, which the summary and the plots read)."""
    run = make_run(tmp_path, checkpoint={"every_steps": 0})
    for _ in run.batches(8):
        run.log(loss=0.25, acc=0.5)
    run.finish(extra_number=1.5)
    r = Results.load(run.run_dir / "results.json")
    assert r.loss == [0.25] * 4 and r.metrics == {"loss": [0.25] * 4, "acc": [0.5] * 4,
                                                   "extra_number": 1.5}


def test_import_star_gives_every_name_without_a_framework():
    import subprocess
    import sys

    code = ("from hpcsuite.api import *\n"
            "import sys\n"
            "assert Batch._fields[:2] == ('ids', 'weights'), Batch\n"
            "assert callable(torch_state) and callable(load_keras_state) and Run and Restored\n"
            "print(sorted(m for m in ('torch', 'tensorflow', 'horovod') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def _run_by_hand(tmp_path, env_extra: dict, script: str):
    """A script run as `python train.py` in tmp_path: no Slurm, no hpcsuite job around it."""
    import os
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCSUITE_", "SLURM_"))}
    env.update(HOME=str(tmp_path), **env_extra)
    return subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


HAND = """from hpcsuite import api
run = api.Run()
for batch in run.batches(20):
    run.log(loss=1.0 / run.step)
run.finish(params={"w": [1.0, 2.0]})
print("rank", run.rank, "of", run.size, "steps", run.step, "dir", run.run_dir)
"""


def test_a_script_tried_by_hand_outside_a_job_says_how_to_run_it(tmp_path):
    done = _run_by_hand(tmp_path, {}, HAND)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: hpcsuite.api.Run: not inside an "
                                                   "hpcsuite job"), done.stderr
    assert "hpcsuite submit SPEC.yaml" in lines[0] and "HPCSUITE_SPEC=SPEC.yaml python train.py" \
        in lines[0]


def test_a_script_tried_by_hand_with_a_spec_runs_in_one_process(tmp_path):
    (tmp_path / "job.yaml").write_text("name: hand\ntrain: {script: train.py, batch_size: 5, "
                                       "epochs: 2, checkpoint: {every_steps: 2}}\n")
    done = _run_by_hand(tmp_path, {"HPCSUITE_SPEC": "job.yaml"}, HAND)
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 1 steps 8 dir" in done.stdout
    run_dir = Path(done.stdout.split(" dir ")[1].strip())
    assert run_dir.parent == tmp_path / "runs" / "hand" / "local"
    r = Results.load(run_dir / "results.json")
    assert (r.status, r.final_step, r.world_size, r.mode) == ("completed", 8, 1, "script")
    assert json.loads((run_dir / "job.json").read_text())["name"] == "hand"


def test_run_without_horovod_in_a_launch_of_several_ranks_is_refused(tmp_path):
    """Each rank would be its own rank 0: the same checkpoints and results.json, twice."""
    (tmp_path / "job.yaml").write_text("name: hand\ntrain: {script: train.py, batch_size: 5}\n")
    for launch in ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"},
                   {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}):
        done = _run_by_hand(tmp_path, {"HPCSUITE_SPEC": "job.yaml", **launch}, HAND)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        line, = done.stderr.strip().splitlines()
        rank, size = (launch.get("OMPI_COMM_WORLD_RANK") or launch["SLURM_PROCID"],
                      launch.get("OMPI_COMM_WORLD_SIZE") or launch["SLURM_STEP_NUM_TASKS"])
        assert line.startswith(f"error: hpcsuite.api.Run(): rank {rank} of {size} ranks") and \
            "api.Run(hvd)" in line, line
        assert not (tmp_path / "runs").exists()
    one = _run_by_hand(tmp_path, {"HPCSUITE_SPEC": "job.yaml", "OMPI_COMM_WORLD_SIZE": "1"}, HAND)
    assert one.returncode == 0, one.stderr


def test_a_bad_spec_tried_by_hand_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "job.yaml").write_text("name: hand\ntrain: {script: train.py, bach_size: 5}\n")
    done = _run_by_hand(tmp_path, {"HPCSUITE_SPEC": "job.yaml"}, HAND)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line, = done.stderr.strip().splitlines()
    assert line.startswith("error: job.yaml: train.bach_size: ") and "batch_size" in line
    done = _run_by_hand(tmp_path, {"HPCSUITE_SPEC": "nope.yaml"}, HAND)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: nope.yaml: no such file (HPCSUITE_SPEC or api.Run(spec=...): the job spec to try "
        "this script with)")
