"""train.monitor.tensorboard without a cluster: what hpcsuite writes, read back by TensorBoard's
own reader (EventAccumulator); a requeued run continuing in one log directory; script mode in
one process; the report line; the spec key. tests/test_e2e_tensorboard.py runs it through Slurm."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpcsuite import api
from hpcsuite.errors import UserError
from hpcsuite.runs.report import tensorboard_line
from hpcsuite.runs.rundir import RunDir
from hpcsuite.runtime.observe import chart as chart_module
from hpcsuite.runtime.observe import tensorboard as tb
from hpcsuite.submit.spec import spec_from_dict


def read(log_dir) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def points(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def f32(x: float) -> float:
    return float(np.float32(x))      # TensorBoard's scalars are float32


def test_written_scalars_read_back_exactly(tmp_path):
    events = tb.EventLog(tmp_path, 0, "node1")
    values = {3: (0.123456789, 0.05), 7: (2.5e-7, 0.025), 9: (float("nan"), None)}
    for step, (loss, lr) in values.items():
        events.scalars(step, {"loss": loss, "learning_rate": lr})
    events.close()
    assert [p.name for p in RunDir(tmp_path).tensorboard_files()] == [events.path.name]
    acc = read(RunDir(tmp_path).tensorboard)
    assert sorted(acc.Tags()["scalars"]) == ["learning_rate", "loss"]
    got = points(acc, "loss")
    assert got[:2] == [(3, f32(0.123456789)), (7, f32(2.5e-7))]
    assert got[2][0] == 9 and np.isnan(got[2][1])
    assert points(acc, "learning_rate") == [(3, f32(0.05)), (7, f32(0.025))]   # None: left out


def test_a_requeued_run_continues_and_drops_what_a_crash_left_past_the_checkpoint(tmp_path):
    """Attempt 0 charted steps 1-8 and crashed after its checkpoint at step 5; attempt 1 resumes
    from step 5 in the same directory: TensorBoard shows 1-5 from attempt 0, 6-8 from attempt 1."""
    first = tb.EventLog(tmp_path, 0, "node1")
    for step in range(1, 9):
        first.scalars(step, {"loss": 100.0 + step})
    first.close()
    second = tb.EventLog(tmp_path, 5, "node2")     # same second: the host orders the names
    for step in range(6, 9):
        second.scalars(step, {"loss": 200.0 + step})
    second.close()
    assert len(RunDir(tmp_path).tensorboard_files()) == 2
    assert points(read(RunDir(tmp_path).tensorboard), "loss") == \
        [(s, 100.0 + s) for s in range(1, 6)] + [(s, 200.0 + s) for s in range(6, 9)]


def test_training_points_carry_the_throughput_since_the_last(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)
    chart = tb.TensorBoard(tmp_path, "node1")
    times, real = [0.5, 0.5, 0.25, 0.25], [64, 64, 64, 64]
    chart.training(12, 10, {"loss": 1.0}, times[:2], real[:2])     # steps 11-12: 128 in 1 s
    chart.training(14, 10, {"loss": 0.5}, times, real)             # steps 13-14: 128 in 0.5 s
    chart.close()
    acc = read(RunDir(tmp_path).tensorboard)
    assert points(acc, "throughput/samples_per_s") == [(12, 128.0), (14, 256.0)]
    assert chart.last_step == 14


def test_training_points_are_rate_limited(tmp_path):
    chart = tb.TensorBoard(tmp_path, "node1")
    assert chart.due()
    chart.training(1, 0, {"loss": 1.0}, [0.01], [8])
    assert not chart.due()            # the next one CHART_SECONDS later, not at every step


def test_a_directory_that_cannot_be_written_is_said_once_and_training_goes_on(tmp_path, caplog):
    blocker = tmp_path / "run"
    blocker.mkdir()
    RunDir(blocker).tensorboard.write_text("a file where the directory goes")
    chart = tb.TensorBoard(blocker, "node1")
    chart.add(1, 0, {"loss": 1.0})
    chart.add(2, 0, {"loss": 1.0})
    chart.close()
    assert chart.broken and not chart.due()
    said = [r.getMessage() for r in caplog.records if "train.monitor.tensorboard" in r.getMessage()]
    assert len(said) == 1 and "cannot write" in said[0]


def test_utilisation_samples_become_tags_per_rank():
    cpu = tb.utilisation_values(1, {"t": 1.0, "step": 3, "cpu_percent": 97.0, "rss_bytes": 2 ** 21})
    assert cpu == {"utilisation/rank1/cpu_percent": 97.0, "utilisation/rank1/memory_mib": 2.0}
    gpu = tb.utilisation_values(0, {"cpu_percent": 5.0, "rss_bytes": 0, "gpu_percent": 80.0,
                                    "gpu_memory_bytes": 3 * 2 ** 20})
    assert gpu["utilisation/rank0/gpu_percent"] == 80.0
    assert gpu["utilisation/rank0/gpu_memory_mib"] == 3.0


def script_run(tmp_path, tensorboard=True):
    job = spec_from_dict({"name": "s", "train": {
        "script": "train.py", "batch_size": 4, "epochs": 3,
        "monitor": {"tensorboard": tensorboard}}}, "t")
    run_dir = tmp_path / "runs" / "s" / "1"
    run_dir.mkdir(parents=True, exist_ok=True)
    return api.Run(None, job=job, run_dir=run_dir), run_dir


def test_script_mode_charts_run_log_and_its_last_step_is_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(chart_module, "CHART_SECONDS", 0.0)        # every step, to compare them all
    run, run_dir = script_run(tmp_path)
    for _ in run.batches(10):                            # 3 steps an epoch, 3 epochs
        run.log(loss=1.0 / (run.step + 1), accuracy=run.step / 10)
    run.finish()
    results = json.loads((run_dir / "results.json").read_text())
    acc = read(RunDir(run_dir).tensorboard)
    assert {"loss", "accuracy", "throughput/samples_per_s"} <= set(acc.Tags()["scalars"])
    assert points(acc, "loss") == [(s, f32(1.0 / (s + 1))) for s in range(1, 10)]
    assert points(acc, "loss")[-1] == (results["final_step"], f32(results["loss"][-1]))
    # 4 samples a step, 2 real in the epoch's last step (10 = 4 + 4 + 2)
    assert all(v > 0 for _, v in points(acc, "throughput/samples_per_s"))


def test_script_mode_at_the_default_rate_still_charts_the_last_step(tmp_path):
    run, run_dir = script_run(tmp_path)
    for _ in run.batches(10):
        run.log(loss=float(run.step))
    run.finish()
    got = points(read(RunDir(run_dir).tensorboard), "loss")
    assert got[0] == (1, 1.0) and got[-1] == (9, 9.0) and len(got) < 9


def test_off_by_default_writes_nothing(tmp_path):
    run, run_dir = script_run(tmp_path, tensorboard=False)
    for _ in run.batches(10):
        run.log(loss=1.0)
    run.finish()
    assert not RunDir(run_dir).tensorboard.exists()
    assert tensorboard_line(run_dir) is None


def test_report_says_where_the_event_files_are(tmp_path):
    tb.EventLog(tmp_path, 0, "node1").close()
    line = tensorboard_line(tmp_path)
    assert line.startswith(f"{RunDir(tmp_path).tensorboard}\n")
    assert f"tensorboard --logdir {RunDir(tmp_path).tensorboard.absolute()}" in line
    assert "one attempt" in line


def test_a_bad_value_names_the_key():
    with pytest.raises(UserError, match=r"train\.monitor\.tensorboard") as e:
        spec_from_dict({"name": "s", "train": {"monitor": {"tensorboard": "often"}}}, "job.yaml")
    assert "\n" not in str(e.value)
