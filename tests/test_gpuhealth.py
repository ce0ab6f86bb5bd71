"""The GPU health check on recorded NVML answers (no GPU here): the pure rule, and the reader
against a fake pynvml module that answers as NVML does (values, NotSupported, missing calls)."""

from types import SimpleNamespace

import pytest

from hpcsuite.gpuhealth import FAIL, GIB, WARN, findings, health_line, read, read_all

# An H100 at rest, as nvidia-ml-py 13 answered it on a healthy node: ECC on, no pending
# remapping, idle clocks, no processes.
HEALTHY = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1",
           "ecc_volatile_uncorrected": 0, "retired_pages_pending": None,
           "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False,
                             "failure": False},
           "clock_reasons": 0x1, "processes": [],
           "memory": {"free": 80 * GIB, "total": 81 * GIB}}


def test_a_healthy_gpu_has_no_findings():
    assert findings(HEALTHY, need_bytes=40 * GIB) == []
    assert health_line(HEALTHY, []) == "GPU 0 (NVIDIA H100 80GB HBM3): healthy"


@pytest.mark.parametrize("change, what, words", [
    ({"ecc_volatile_uncorrected": 3}, "ecc", "3 volatile uncorrected ECC"),
    ({"retired_pages_pending": True}, "retired_pages", "page retirement pending"),
    ({"remapped_rows": {"pending": True, "failure": False}}, "remapped_rows", "remapping pending"),
    ({"remapped_rows": {"pending": False, "failure": True}}, "remapped_rows", "remapping failed"),
    ({"clock_reasons": 0x40 | 0x1}, "clocks", "hardware thermal slowdown"),
    ({"clock_reasons": 0x8}, "clocks", "hardware slowdown"),
    ({"clock_reasons": 0x80}, "clocks", "power brake"),
    ({"clock_reasons": 0x20}, "clocks", "software thermal"),
    ({"processes": [{"pid": 4242, "used_bytes": 3 * GIB}]}, "processes", "pid 4242; 3.0 GiB"),
    ({"memory": {"free": 10 * GIB, "total": 81 * GIB}}, "memory", "10.0 GiB free of 81.0 GiB"),
])
def test_each_fault_fails_the_gpu_and_says_what(change, what, words):
    found = findings({**HEALTHY, **change}, need_bytes=40 * GIB)
    assert [(f.severity, f.what) for f in found] == [(FAIL, what)]
    assert words in found[0].detail
    assert words in health_line({**HEALTHY, **change}, found)


@pytest.mark.parametrize("mask", [0x0, 0x1, 0x2, 0x10, 0x100, 0x1 | 0x2 | 0x10 | 0x100])
def test_idle_and_benign_clock_reasons_pass(mask):
    assert findings({**HEALTHY, "clock_reasons": mask}) == []


def test_a_software_power_cap_only_warns_and_an_unknown_bit_fails():
    assert [(f.severity, f.detail) for f in findings({**HEALTHY, "clock_reasons": 0x4 | 0x1})] \
        == [(WARN, "clocks slowed: software power cap")]
    (f,) = findings({**HEALTHY, "clock_reasons": 0x4 | 0x400})
    assert f.severity == FAIL and "unknown reason 0x400" in f.detail


def test_own_processes_are_not_anothers_and_unknown_answers_are_no_fault():
    assert findings({**HEALTHY, "processes": [{"pid": 7, "used_bytes": None}]},
                    own_pids=frozenset({7})) == []
    unknown = {k: None for k in HEALTHY}
    assert findings(unknown, need_bytes=GIB) == []       # a query the GPU does not support


class NVMLError(Exception):
    pass


def fake_nvml(**answers):
    """A pynvml stand-in: each NVML call returns its recorded answer, raises NVMLError
    (NotSupported) for an answer recorded as an exception, and is absent when not recorded."""
    calls = []

    def call(name):
        def function(*args):
            calls.append((name, args))
            value = answers[name]
            if isinstance(value, Exception):
                raise value
            return value
        return function

    module = SimpleNamespace(NVMLError=NVMLError, calls=calls,
                             nvmlInit=lambda: calls.append(("init", ())),
                             nvmlShutdown=lambda: calls.append(("shutdown", ())),
                             nvmlDeviceGetCount=lambda: 1,
                             nvmlDeviceGetHandleByIndex=lambda i: f"handle-{i}")
    for name in answers:
        setattr(module, name, call(name))
    return module


RECORDED = {   # an A100 whose row remapping waits for a reset, with another user's process
    "nvmlDeviceGetIndex": 0, "nvmlDeviceGetName": b"NVIDIA A100-SXM4-40GB",
    "nvmlDeviceGetUUID": "GPU-abc", "nvmlDeviceGetTotalEccErrors": 0,
    "nvmlDeviceGetRetiredPagesPendingStatus": NVMLError("Not Supported"),
    "nvmlDeviceGetRemappedRows": (0, 1, 1, 0),
    "nvmlDeviceGetCurrentClocksEventReasons": 0x1,
    "nvmlDeviceGetComputeRunningProcesses": [SimpleNamespace(pid=99, usedGpuMemory=(1 << 64) - 1)],
    "nvmlDeviceGetMemoryInfo": SimpleNamespace(free=30 * GIB, total=40 * GIB),
}


def test_read_turns_nvml_answers_into_plain_data():
    nvml = fake_nvml(**RECORDED)
    answers = read(nvml, "h")
    assert answers == {
        "index": 0, "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-abc",
        "ecc_volatile_uncorrected": 0, "retired_pages_pending": None,
        "remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False},
        "clock_reasons": 1, "processes": [{"pid": 99, "used_bytes": None}],
        "memory": {"free": 30 * GIB, "total": 40 * GIB}}
    assert ("nvmlDeviceGetTotalEccErrors", ("h", 1, 0)) in nvml.calls   # uncorrected, volatile
    assert [f.what for f in findings(answers)] == ["remapped_rows", "processes"]


def test_read_falls_back_to_the_older_throttle_call_and_read_all_shuts_nvml_down():
    recorded = dict(RECORDED)
    del recorded["nvmlDeviceGetCurrentClocksEventReasons"]
    recorded["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x8
    nvml = fake_nvml(**recorded)
    (answers,) = read_all(nvml)
    assert answers["clock_reasons"] == 0x8
    assert nvml.calls[0] == ("init", ()) and nvml.calls[-1] == ("shutdown", ())


# ---------------------------------------------------------------------- in doctor
def test_summarize_a_nodes_gpus():
    from hpcsuite.gpuhealth import summarize

    assert summarize([HEALTHY, HEALTHY]) == ("pass", "2 GPU(s) healthy")
    assert summarize([]) == ("pass", "no GPU")
    assert summarize("no GPU (NVML: Driver Not Loaded)") == ("pass", "no GPU (NVML: Driver Not Loaded)")
    status, line = summarize([HEALTHY, {**HEALTHY, "index": 1, "ecc_volatile_uncorrected": 2}])
    assert status == FAIL and line == ("GPU 1 (NVIDIA H100 80GB HBM3): 2 volatile uncorrected ECC "
                                       "error(s) since the driver loaded; 1 GPU(s) healthy")
    assert summarize([{**HEALTHY, "clock_reasons": 0x4}])[0] == WARN


def test_doctor_on_a_node_with_an_unfit_gpu_fails_its_gpus_check(monkeypatch):
    import sys

    from hpcsuite.site.doctor import FAIL as DOCTOR_FAIL, check_gpus
    from hpcsuite.submit.site_profile import SiteProfile

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(**RECORDED))
    check = check_gpus(SiteProfile())
    assert check.status == DOCTOR_FAIL
    assert check.detail.startswith("1 GPU(s) on this node (NVML): GPU 0 (NVIDIA A100-SXM4-40GB): "
                                   "row remapping pending (needs a GPU reset); held by 1 other")
    assert "reset the GPU" in check.hint


def test_doctor_judges_the_compute_nodes_gpus_from_its_probe(monkeypatch):
    import json

    from hpcsuite.site import doctor

    probe = {"python": "3.11.2", "host": "gpu1", "numpy": "2.1", "torch": "2.5", "tensorflow": "2.18",
             "horovod": "0.28.1", "mpi4py": "4.0", "gpu_health": [HEALTHY, {**HEALTHY, "index": 1,
                                                                           "clock_reasons": 0x40}]}
    monkeypatch.setattr(doctor, "_run", lambda argv, timeout=0: (0, "HPCSUITE_PROBE=" + json.dumps(probe)))
    check = doctor.check_compute("python3", None)
    assert check.status == doctor.FAIL and check.detail.endswith(
        "; GPU 1 (NVIDIA H100 80GB HBM3): clocks slowed: hardware thermal slowdown; 1 GPU(s) healthy")
    probe["gpu_health"] = "no GPU (NVML: NVML Shared Library Not Found)"
    check = doctor.check_compute("python3", None)
    assert check.status == doctor.PASS and check.detail.endswith("; no GPU (NVML: NVML Shared "
                                                                 "Library Not Found)")
