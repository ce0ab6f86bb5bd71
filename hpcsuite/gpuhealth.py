"""Is a GPU fit to train on? NVML's answers about one device, and what is wrong with them.

Two layers. :func:`read` asks NVML (the ``pynvml`` module of nvidia-ml-py, passed in) about one
device handle and returns plain data, ``None`` where the device does not support a query;
:func:`findings` is a pure function of that data. Unit tests feed :func:`findings` recorded
answers, and :func:`read` a fake module; `hpcsuite doctor` (on the login node and on a compute
node) and the job's preflight step (``preflight.gpu``, on every rank's own GPU) use both.

What fails a GPU (it would fail hours in, or run slower than its peers from the first step):

* volatile uncorrected ECC errors since the driver loaded (NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
  NVML_VOLATILE_ECC): the memory returned wrong bits; NVIDIA's advice is to drain the node;
* retired pages pending (pre-Ampere) or remapped rows pending / a remapping failure (Ampere
  and later): a retirement or remapping waits for a GPU reset, until then the bad rows are live;
* an active clock slowdown that is not idle: hardware slowdown, thermal (software or
  hardware) or the power brake. Idle, application clocks a user or site set, sync boost and the
  display clock are how an idle, healthy GPU reports (not a fault); a software power cap is
  only a warning: an idle GPU rarely shows it, a busy one often does by design;
* another process's compute context on the device: a rank would share it (at preflight time
  no rank of this job has touched its GPU yet, so every process NVML lists is someone else's);
* less free memory than the job says it needs (``preflight.gpu_free_gib``).

The core's standard library only: the login-node doctor imports this; pynvml is the caller's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FAIL, WARN = "fail", "warn"

# NVML's clock event (throttle) reasons, nvml.h nvmlClocksEventReason*.
REASONS = {
    0x1: "idle", 0x2: "applications clocks setting", 0x4: "software power cap",
    0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown", 0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}
BENIGN_REASONS = 0x1 | 0x2 | 0x10 | 0x100
WARN_REASONS = 0x4
GIB = 1 << 30

UNCORRECTED, VOLATILE = 1, 0      # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC


@dataclass(frozen=True)
class Finding:
    severity: str        # fail | warn
    what: str            # ecc, retired_pages, remapped_rows, clocks, processes, memory
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


def reason_names(mask: int) -> list[str]:
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    return names + ([f"unknown reason 0x{unknown:x}"] if unknown else [])


def findings(answers: dict, need_bytes: int = 0, own_pids: frozenset[int] = frozenset()
             ) -> list[Finding]:
    """What is wrong with one GPU, from :func:`read`'s ``answers``; empty: fit to train on.
    ``need_bytes``: free memory the job needs (0: not checked); ``own_pids``: processes that
    are this job's own (not counted as another's)."""
    out = []
    ecc = answers.get("ecc_volatile_uncorrected")
    if ecc:
        out.append(Finding(FAIL, "ecc", f"{ecc} volatile uncorrected ECC error(s) since the "
                                        "driver loaded"))
    if answers.get("retired_pages_pending"):
        out.append(Finding(FAIL, "retired_pages", "page retirement pending (needs a GPU reset)"))
    rows = answers.get("remapped_rows") or {}
    if rows.get("pending"):
        out.append(Finding(FAIL, "remapped_rows", "row remapping pending (needs a GPU reset)"))
    if rows.get("failure"):
        out.append(Finding(FAIL, "remapped_rows", "a row remapping failed"))
    mask = answers.get("clock_reasons")
    if mask:
        bad, warn = mask & ~(BENIGN_REASONS | WARN_REASONS), mask & WARN_REASONS
        if bad:
            out.append(Finding(FAIL, "clocks", "clocks slowed: " + ", ".join(reason_names(bad))))
        elif warn:
            out.append(Finding(WARN, "clocks", "clocks slowed: " + ", ".join(reason_names(warn))))
    others = [p for p in answers.get("processes") or () if p["pid"] not in own_pids]
    if others:
        used = sum(p.get("used_bytes") or 0 for p in others)
        out.append(Finding(FAIL, "processes", f"held by {len(others)} other process(es) (pid "
                           f"{', '.join(str(p['pid']) for p in others[:4])}; "
                           f"{used / GIB:.1f} GiB)"))
    memory = answers.get("memory")
    if need_bytes and memory and memory["free"] < need_bytes:
        out.append(Finding(FAIL, "memory", f"{memory['free'] / GIB:.1f} GiB free of "
                           f"{memory['total'] / GIB:.1f} GiB, the job needs "
                           f"{need_bytes / GIB:.1f} GiB"))
    return out


def health_line(answers: dict, found: list[Finding]) -> str:
    """One line: which GPU, and what is wrong with it (or that nothing is)."""
    name = f"GPU {answers.get('index', '?')} ({answers.get('name') or 'unknown'})"
    if not found:
        return f"{name}: healthy"
    return f"{name}: " + "; ".join(f.detail for f in found)


def summarize(devices: list[dict] | str | None, need_bytes: int = 0) -> tuple[str, str]:
    """(fail | warn | pass, one line) over a node's devices (:func:`read_all`'s answers; a
    string: why NVML did not answer, e.g. no GPU on the node)."""
    if not isinstance(devices, list) or not devices:
        return "pass", devices if isinstance(devices, str) else "no GPU"
    found = [(d, findings(d, need_bytes)) for d in devices]
    worst = {f.severity for _, fs in found for f in fs}
    status = FAIL if FAIL in worst else WARN if WARN in worst else "pass"
    unfit = [health_line(d, fs) for d, fs in found if fs]
    healthy = len(devices) - len(unfit)
    return status, "; ".join(unfit + ([f"{healthy} GPU(s) healthy"] if healthy else []))


# ------------------------------------------------------------------- asking NVML
def _ask(nvml, call, *args):
    """NVML's answer, or None where the device does not support the query (or NVML lacks
    the function in this version of nvidia-ml-py)."""
    function = getattr(nvml, call, None)
    if function is None:
        return None
    try:
        return function(*args)
    except nvml.NVMLError:
        return None


def read(nvml, handle) -> dict:
    """The answers :func:`findings` needs, from an initialised NVML (the pynvml module) about
    one device ``handle``."""
    name = _ask(nvml, "nvmlDeviceGetName", handle)
    rows = _ask(nvml, "nvmlDeviceGetRemappedRows", handle)
    memory = _ask(nvml, "nvmlDeviceGetMemoryInfo", handle)
    reasons = _ask(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:
        reasons = _ask(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    processes = _ask(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    pending = _ask(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    return {
        "index": _ask(nvml, "nvmlDeviceGetIndex", handle),
        "name": name.decode() if isinstance(name, bytes) else name,
        "uuid": _text(_ask(nvml, "nvmlDeviceGetUUID", handle)),
        "ecc_volatile_uncorrected": _ask(nvml, "nvmlDeviceGetTotalEccErrors", handle,
                                         UNCORRECTED, VOLATILE),
        "retired_pages_pending": None if pending is None else bool(pending),
        "remapped_rows": None if rows is None else {
            "correctable": int(rows[0]), "uncorrectable": int(rows[1]),
            "pending": bool(rows[2]), "failure": bool(rows[3])},
        "clock_reasons": None if reasons is None else int(reasons),
        "processes": None if processes is None else [
            {"pid": int(p.pid), "used_bytes": _bytes(getattr(p, "usedGpuMemory", None))}
            for p in processes],
        "memory": None if memory is None else {"free": int(memory.free),
                                               "total": int(memory.total)},
    }


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value) -> int | None:
    # NVML reports NVML_VALUE_NOT_AVAILABLE (2**64 - 1) where it may not say (another user's)
    return int(value) if value is not None and value < (1 << 63) else None


def read_all(nvml) -> list[dict]:
    """Every device this node's NVML shows (initialises and shuts NVML down itself)."""
    nvml.nvmlInit()
    try:
        return [read(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()
