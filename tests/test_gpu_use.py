"""What NVML sees, used (issue V, point 6): each GPU rank's energy over the run, in results.json,
TensorBoard and study tables, and the starved-GPU rule `status` and `report` apply to the
recorded samples. No GPU here: NVML is a fake pynvml module put where the monitor imports it,
answering as nvidia-ml-py does (counters in millijoules, NVMLError_NotSupported)."""

import json
import sys
import time
import types
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.runs import gpu_use
from hpcsuite.runs.results import Results, energy_record
from hpcsuite.runtime.observe.monitor import Sampler

WATTS = 300.0


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):   # noqa: N801 - nvidia-ml-py's name
    def __str__(self):
        return "Not Supported"


def fake_nvml(energy=True, busy=32):
    """A pynvml whose GPU draws WATTS (its energy counter follows the clock, as NVML's does)
    and is ``busy`` percent busy; without ``energy`` it is a pre-Volta GPU."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    nvml.nvmlDeviceGetHandleByUUID = lambda u: f"uuid {u}"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=busy, memory=10)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def total_energy(handle):
        if not energy:
            raise NVMLError_NotSupported()
        return int(4_000_000_000 + time.monotonic() * WATTS * 1000)   # mJ since driver load

    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return nvml


# ---------------------------------------------------------------------- the monitor

def test_sampler_records_the_gpus_energy_from_start_to_stop(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    sampler = Sampler(0.05, rank=0, device="cuda:0").start(SimpleNamespace(step=1))
    time.sleep(0.3)
    samples = sampler.stop()
    assert sampler.energy_j == pytest.approx(WATTS * 0.3, rel=0.3)
    assert samples[-1]["gpu_percent"] == 32.0 and samples[-1]["gpu_memory_bytes"] == 3 * 2**30


def test_a_gpu_without_an_energy_counter_leaves_it_absent_and_samples_go_on(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy=False))
    caplog.set_level("INFO", logger="hpcsuite.runtime.observe.monitor")
    sampler = Sampler(0.05, rank=0, device="cuda:0").start(SimpleNamespace(step=1))
    time.sleep(0.12)
    samples = sampler.stop()
    assert sampler.energy_j is None and samples[-1]["gpu_percent"] == 32.0
    assert "no GPU energy figure (NVML: Not Supported)" in caplog.text


def test_a_rank_reads_the_gpu_it_was_placed_on_not_nvmls_first(monkeypatch):
    # placement left rank 1 of a node GPU 3 (CUDA_VISIBLE_DEVICES=3): CUDA calls it cuda:0,
    # NVML numbers every GPU of the node
    from hpcsuite.runtime.observe.monitor import nvml_handle

    nvml = fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert nvml_handle(nvml, "cuda:0") == "handle3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert nvml_handle(nvml, "cuda:1") == "handle3" and nvml_handle(nvml, "cuda") == "handle2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c")
    assert nvml_handle(nvml, "cuda:0") == "uuid GPU-8f2c"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_handle(nvml, "cuda:1") == "handle1"
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert Sampler(0.05, rank=1, device="cuda:0").gpu == (nvml, "handle3")


def test_cpu_ranks_have_no_energy():
    sampler = Sampler(0.05, rank=0).start(SimpleNamespace(step=1))
    sampler.stop()
    assert sampler.energy_j is None


def _real_nvml() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver, no GPU
        return False


@pytest.mark.skipif(not _real_nvml(), reason="no NVIDIA GPU here (NVML does not start): the "
                    "real energy counter was not read")
def test_a_real_gpus_energy_counter_over_a_second():
    """On a lent GPU machine: NVML's own answers. An idle H100/H200 draws tens of watts, so a
    second is tens of joules (Volta and newer have the counter; older GPUs skip)."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError_NotSupported:
        pytest.skip("this GPU has no energy counter (before Volta)")
    sampler = Sampler(0.1, rank=0, device="cuda:0").start(SimpleNamespace(step=1))
    time.sleep(1.0)
    samples = sampler.stop()
    assert 5.0 < sampler.energy_j < 1500.0, sampler.energy_j
    assert "gpu_percent" in samples[-1]


def test_energy_record_sums_the_ranks_and_divides_only_a_whole_sum():
    assert energy_record([100.0, 300.0], 2000) == {
        "energy_j_per_rank": [100.0, 300.0], "energy_j": 400.0, "samples_per_joule": 5.0}
    partial = energy_record([100.0, None], 2000)
    assert partial["energy_j"] == 100.0 and partial["samples_per_joule"] is None
    assert energy_record([None, None], 2000) == energy_record([], 0) == {}


def test_a_results_file_with_a_non_number_energy_is_named(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"energy_j": "lots"}))
    from hpcsuite.errors import UserError
    with pytest.raises(UserError, match="energy_j: expected a number, got str"):
        Results.load(path)


# ---------------------------------------------------------------------- the managed loop

class Backend:
    """test_session's thread collectives, a model that computes nothing, on a GPU."""
    name, device = "torch", "cuda:0"

    def __init__(self, ranks):
        self.ranks, self.rank, self.size, self.local_rank = ranks, ranks.rank, ranks.size, 0

    def __getattr__(self, name):
        return getattr(self.__dict__["ranks"], name)

    def build(self, data): pass
    def feed(self, data, batches):
        for b in batches:
            time.sleep(0.002)
            yield b, None
    def micro_step(self, inputs, scale, last, padded): return 1.0
    def set_lr(self, lr): pass
    def losses_to_floats(self, losses): return [float(v) for v in losses]
    def broadcast_state(self): pass
    def checksum(self): return "c"
    def gradient_sizes(self): return [1]
    def precision_seen(self): return {}
    def versions(self): return {}


def test_the_managed_loop_records_each_ranks_energy_and_charts_it(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_session import on_ranks

    from hpcsuite.runtime.session.loop import Trainer
    from hpcsuite.runtime.rank.signals import StopFlag
    from hpcsuite.submit.spec import spec_from_dict

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    job = spec_from_dict({"name": "e", "output_dir": str(tmp_path / "runs"), "train": {
        "batch_size": 4, "max_steps": 40, "data": {"samples": 64, "shape": [2]},
        "monitor": {"enabled": True, "interval_seconds": 0.05, "tensorboard": True}}}, "t")
    (tmp_path / "run").mkdir()
    r = on_ranks(2, lambda rank, ranks: Trainer(job, tmp_path / "run", Backend(ranks),
                                                StopFlag()).run()[1])[0]
    assert len(r.energy_j_per_rank) == 2 and all(j > 0 for j in r.energy_j_per_rank)
    assert r.energy_j == pytest.approx(sum(r.energy_j_per_rank))
    assert r.energy_j == pytest.approx(2 * WATTS * r.elapsed_s, rel=0.5)
    assert r.samples_per_joule == pytest.approx(r.samples / r.energy_j)
    r.write(tmp_path / "run")
    assert Results.load(tmp_path / "run" / "results.json").energy_j == r.energy_j
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("energy/joules")] == [40]
    assert acc.Scalars("energy/joules")[0].value == pytest.approx(r.energy_j, rel=1e-6)
    assert acc.Scalars("energy/samples_per_joule")[0].value == \
        pytest.approx(r.samples_per_joule, rel=1e-6)


# ---------------------------------------------------------------------- the starved-GPU rule

def series(busy: list[float], start_step=0, every=5):
    """One rank's samples as train.monitor records them (one a second, the step it was at):
    the first taken before the first step ended."""
    return [{"t": float(i + 1), "step": start_step + every * i, "cpu_percent": 100.0,
             "rss_bytes": 2**31, "gpu_percent": b, "gpu_memory_bytes": 3 * 2**30}
            for i, b in enumerate(busy)]


# the issue's run: resnet, b128, amp on one H200, 30-35 % busy, data_wait_fraction 0.12
ISSUE_RUN = series([0.0, 31.0, 33.0, 30.0, 35.0, 31.0, 32.0, 30.0])
STEPS = [0.02] * 40


def test_a_gpu_waiting_for_its_data_is_starved_and_both_numbers_are_named():
    v = gpu_use.gpu_verdict([ISSUE_RUN], 0.12, STEPS)
    assert v["kind"] == "starved" and v["busy_percent"] == 31.0 and v["samples"] == 7
    assert v["line"] == ("GPU 31 % busy, 12 % of the step waiting for data: raise "
                         "train.data.workers / train.data.prefetch")


def test_a_gpu_idle_with_its_data_on_time_is_underused_not_starved():
    v = gpu_use.gpu_verdict([ISSUE_RUN], 0.02, STEPS)
    assert v["kind"] == "underused" and "raise train.data" not in v["line"]
    assert v["line"].startswith("GPU 31 % busy, 2 % of the step waiting for data: the input "
                                "keeps up") and "train.batch_size" in v["line"]


def test_a_busy_gpu_says_nothing_even_with_some_data_wait():
    v = gpu_use.gpu_verdict([series([0.0, 97.0, 99.0, 98.0, 96.0])], 0.15, STEPS)
    assert v["kind"] == "busy" and v["line"] is None and v["busy_percent"] == 97.5


def test_the_thresholds_are_where_the_docstring_says():
    at = series([0.0] + [gpu_use.BUSY_BELOW] * 3)
    assert gpu_use.gpu_verdict([at], 0.5, STEPS)["kind"] == "busy"
    below = series([0.0] + [gpu_use.BUSY_BELOW - 1] * 3)
    assert gpu_use.gpu_verdict([below], gpu_use.WAIT_AT_LEAST, STEPS)["kind"] == "starved"
    assert gpu_use.gpu_verdict([below], gpu_use.WAIT_AT_LEAST - 0.001, STEPS)["kind"] == \
        "underused"


def test_samples_before_the_first_step_and_too_short_runs_are_not_judged():
    # a run busy only while it trained: its start (model building, step 0) is not held against it
    warm = series([0.0, 0.0, 0.0, 90.0, 92.0, 91.0])
    for s in warm[:3]:
        s["step"] = 0
    assert gpu_use.gpu_verdict([warm], 0.3, STEPS)["kind"] == "busy"
    assert gpu_use.gpu_verdict([series([0.0, 20.0, 20.0])], 0.3, STEPS) is None   # 2 samples
    assert gpu_use.gpu_verdict([ISSUE_RUN], 0.3, STEPS[:9]) is None                # 9 steps
    # a resumed attempt: its steps count from where it began
    assert gpu_use.gpu_verdict([series([20.0] * 4, start_step=500)], 0.3, STEPS,
                               start_step=500)["kind"] == "starved"
    cpu = [[{k: v for k, v in s.items() if not k.startswith("gpu")} for s in ISSUE_RUN]]
    assert gpu_use.gpu_verdict(cpu, 0.3, STEPS) is None and gpu_use.gpu_verdict([], 0.3, STEPS) is None


def test_every_ranks_samples_count():
    v = gpu_use.gpu_verdict([ISSUE_RUN, series([0.0, 90.0, 92.0, 94.0, 96.0, 98.0, 97.0, 95.0])],
                            0.12, STEPS)
    assert v["samples"] == 14 and v["kind"] == "busy"     # the median of both GPUs: 63.5 %


# ---------------------------------------------------------------------- status and report

def finished_run(tmp_path, busy: list[float], energy=(1500.0, 1700.0)):
    run = tmp_path / "run"
    run.mkdir()
    (run / "submit.json").write_text(json.dumps({"job_id": "77"}))
    Results(job="g", job_id="77", world_size=2, batch_size_per_rank=128, steps=40, final_step=40,
            samples=10240, loss=[1.0] * 40, step_times_s=STEPS, data_wait_fraction=0.12,
            utilisation=[series(busy), series(busy)],
            **energy_record(list(energy), 10240)).write(run)
    return run


def cli(monkeypatch, tmp_path, *args):
    from hpcsuite.runs import jobs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jobs, "query", lambda job_id: jobs.JobState(
        job_id, "COMPLETED", "0:0", None, None, None, "00:01:00", source="sacct"))
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


STARVED = "GPU 31 % busy, 12 % of the step waiting for data: raise train.data.workers"


def test_status_and_report_say_a_gpu_was_starved(tmp_path, monkeypatch):
    run = finished_run(tmp_path, [0.0, 31.0, 33.0, 30.0, 35.0, 31.0, 32.0, 30.0])
    status = cli(monkeypatch, tmp_path, "status", str(run))
    assert f"  {STARVED}" in status
    assert "  GPU energy 3.2 kJ over 2 GPU(s), 3.2 samples/J" in status
    data = json.loads(cli(monkeypatch, tmp_path, "status", str(run), "--json"))["results"]
    assert data["gpu"]["kind"] == "starved" and data["energy_j"] == 3200.0
    assert data["samples_per_joule"] == pytest.approx(3.2)
    report = cli(monkeypatch, tmp_path, "report", str(run), "--out", str(tmp_path / "png"))
    assert STARVED in report and "GPU energy 3.2 kJ" in report


def test_a_busy_gpu_gets_no_starved_line(tmp_path, monkeypatch):
    run = finished_run(tmp_path, [0.0, 95.0, 96.0, 97.0, 94.0], energy=(1500.0, None))
    status = cli(monkeypatch, tmp_path, "status", str(run))
    report = cli(monkeypatch, tmp_path, "report", str(run), "--out", str(tmp_path / "png"))
    for text in (status, report):
        assert "waiting for data" not in text and "% busy" not in text
        assert "GPU energy 1.5 kJ over 1 GPU(s) (of 2 ranks' GPUs; the others did not " \
               "report it)" in text


# ---------------------------------------------------------------------- study tables

def test_study_tables_carry_energy_as_a_column_when_measured(tmp_path):
    from test_study import fake_study, steady

    from hpcsuite.study import report as sr

    plain = sr.analyse(fake_study(tmp_path / "plain", steady(0.005, 0.005, 0.010, 0.006)))
    assert "samples/J" not in sr.table(plain)
    assert sr.flat(plain["rows"][0])["measured_energy_j"] is None
    sd = fake_study(tmp_path / "gpu", steady(0.005, 0.005, 0.010, 0.006))
    for path in (sd.path / "runs").glob("s-p0*-r*/*/results.json"):   # the train points
        data = json.loads(path.read_text())
        joules = 100.0 * data["world_size"] + (5.0 if "-r1" in str(path) else 0.0)
        path.write_text(json.dumps({**data, "energy_j": joules,
                                    "samples_per_joule": 640 / joules}))
    report = sr.analyse(sd)
    two = report["rows"][1]
    assert two["energy_j"]["median"] == 202.5 and two["energy_j"]["n"] == 2
    flat = sr.flat(two)
    assert flat["measured_energy_j"] == 202.5 and set(flat) == set(sr.COLUMNS)
    assert flat["measured_samples_per_joule"] == pytest.approx((640 / 200 + 640 / 205) / 2)
    text = sr.table(report)
    assert "GPU J" in text and "samples/J" in text
    line = next(l for l in text.splitlines() if l.startswith("all") and " 2 " in l)
    assert " 202.5 " in line and f" {flat['measured_samples_per_joule']:.2f}" in line
