"""Per-rank utilisation sampling while training (``train.monitor``).

A daemon thread wakes every ``interval_seconds`` and records the rank's CPU use (psutil: this
process, all its threads, in percent of one core) and resident memory, and with a GPU its
utilisation and memory (NVML, through nvidia-ml-py). The series goes into results.json; with
``prometheus_dir`` each rank also rewrites a node_exporter textfile (written by
prometheus_client, atomically) so a site's Prometheus scrapes the job while it runs. The file
is named by cluster, user and job (:func:`textfile_name`) and its metrics carry them as labels:
a job id Slurm gives again (a reset state, another cluster sharing the directory) never lands on
another user's or another cluster's file. A write that fails is said in the rank's log and
recorded in the run directory (:mod:`hpcsuite.runs.monitor_failures`), where `status` and
`submit --wait` read it; the rank stops writing and trains on.
The thread only reads counters: its cost is a few syscalls a second. When the rank ends the
textfile is written once more, with the final values and the end said
(``hpcsuite_job_running 0``, ``hpcsuite_job_end_time_seconds``, ``hpcsuite_job_ended{status}``):
at the end of training (completed, preempted, ...) and, through :func:`end_all`, by a rank that
fails or is ended by another's failure; so a dashboard never shows a finished job as running.

With a GPU the sampler also reads the GPU's energy counter (NVML's total energy since the driver
loaded, in millijoules; Volta and newer) when training starts and when it stops:
:attr:`Sampler.energy_j` is the difference, or None where the GPU does not report it (never an
error: the rank trains on).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

from ...errors import UserError
from ...runs import monitor_failures
from ...world import World, current

log = logging.getLogger(__name__)

_ACTIVE: list["Sampler"] = []     # started and not yet stopped (end_all)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]")   # what a name part may not hold in a file name


def job_user() -> str:
    """The user this rank runs as (whose files it writes): its login name, else ``uid-N``
    (a container without the user in its passwd)."""
    import pwd

    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def cluster_name(world: World) -> str:
    """Slurm's cluster (SLURM_CLUSTER_NAME); ``local`` outside a Slurm job (its job id is
    ``local`` too), ``unknown`` in a job whose Slurm does not say it."""
    return world.cluster or ("unknown" if world.job_id else "local")


def textfile_name(cluster: str, user: str, job_id: str, rank: int) -> str:
    """``hpcsuite-CLUSTER-USER-JOBID-rank-N.prom``, each part kept to letters, digits and
    ``. _ + @ -`` (anything else becomes ``_``) and 64 characters."""
    parts = [_UNSAFE.sub("_", str(p))[:64] or "_" for p in (cluster, user, job_id)]
    return f"hpcsuite-{'-'.join(parts)}-rank-{rank}.prom"


class Sampler:
    def __init__(self, interval: float, rank: int, device: str = "cpu",
                 prometheus_dir: str | None = None, job: str = "", host: str = "",
                 run_dir: str | Path | None = None):
        try:
            import psutil
        except ImportError:
            raise UserError("train.monitor: needs psutil on the compute nodes (pip install "
                            "'hpcsuite[train]')") from None
        self.interval, self.rank, self.job, self.host = interval, rank, job, host
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)          # the first call only starts the measurement
        self.samples: list[dict] = []
        self.progress = None                 # the loop's Progress: its step is read, not set
        # (own, wait) seconds per step at the rank's last vote and rank 0's slow-rank finding:
        # set by the loop, read for the Prometheus textfile
        self.balance: tuple = (None, None, None)
        self.gpu = self._nvml(device)
        self.energy_j: float | None = None   # the GPU's joules from start() to stop()
        self._energy0: int | None = None
        self.prom_path = None
        world, user = current(), job_user()
        self.attempt, self.run_dir = world.attempt, run_dir   # run_dir: where a failure is said
        self.labels = {"job": job, "job_id": world.job_id or "", "rank": str(rank),
                       "host": host, "cluster": cluster_name(world), "user": user}
        self._written = False       # the first write clears an earlier attempt's failure
        if prometheus_dir:
            directory = Path(prometheus_dir)
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"train.monitor.prometheus_dir: cannot create {directory} "
                                f"({e.strerror})") from None
            self.prom_path = directory / textfile_name(cluster_name(world), user,
                                                       world.job_id or "local", rank)
        self._t0 = time.monotonic()
        self.ended: tuple[str, float] | None = None   # (status, Unix time) once the rank ended
        self._writing = threading.Lock()   # one textfile write at a time: the last is the end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcsuite-monitor", daemon=True)

    @staticmethod
    def _nvml(device: str):
        if not device.startswith("cuda"):
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml, nvml_handle(pynvml, device)
        except Exception as e:   # noqa: BLE001 - no NVML: CPU figures only, said once
            log.warning("train.monitor: no GPU figures (NVML: %s)", e)
            return None

    def start(self, progress=None) -> "Sampler":
        self.progress = progress
        self._energy0 = self.energy_mj()
        self._t0 = time.monotonic()
        self._thread.start()
        _ACTIVE.append(self)
        return self

    def stop(self, status: str = "completed") -> list[dict]:
        """Stop sampling: the final sample joins the series and, with ``prometheus_dir``, the
        textfile (with the job's end and ``status``: completed, preempted, ...)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.samples.append(self.sample())   # the end of the run is always in the series
        self.finish(status, self.samples[-1])
        end = self.energy_mj() if self._energy0 is not None else None
        if end is not None and end >= self._energy0:
            self.energy_j = (end - self._energy0) / 1000.0
        if self.gpu is not None:
            try:
                self.gpu[0].nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        return self.samples

    def energy_mj(self) -> int | None:
        """The GPU's energy counter (millijoules since the driver loaded), or None: no GPU,
        or one that does not report it (NVMLError_NotSupported before Volta; said once)."""
        if self.gpu is None:
            return None
        nvml, handle = self.gpu
        try:
            return int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception as e:  # noqa: BLE001 - energy is a figure, never a reason to fail
            if self._energy0 is None:
                log.info("train.monitor: no GPU energy figure (NVML: %s)", e)
            return None

    def sample(self) -> dict:
        mem = self.proc.memory_info()
        s = {"t": round(time.monotonic() - self._t0, 3),
             "step": getattr(self.progress, "step", 0),
             "cpu_percent": self.proc.cpu_percent(None), "rss_bytes": mem.rss}
        if self.gpu is not None:
            nvml, handle = self.gpu
            try:
                s["gpu_percent"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                s["gpu_memory_bytes"] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except Exception:  # noqa: BLE001 - a GPU that stops answering: CPU figures go on
                pass
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            s = self.sample()
            self.samples.append(s)
            self._textfile(s)

    def _textfile(self, s: dict, timeout: float = -1) -> None:
        """Write the textfile with sample ``s`` (once the rank has ended, every write says so)."""
        if self.prom_path is None or not self._writing.acquire(timeout=timeout):
            return
        try:
            self.write_prometheus(s)
            if not self._written and self.run_dir is not None:
                monitor_failures.clear(self.run_dir, self.rank)
            self._written = True
        except OSError as e:
            log.warning("train.monitor: cannot write %s (%s); not trying again",
                        self.prom_path, e.strerror or e)
            if self.run_dir is not None:
                monitor_failures.record(self.run_dir, self.rank, self.attempt, self.host,
                                        self.prom_path, str(e.strerror or e))
            self.prom_path = None
        finally:
            self._writing.release()

    def finish(self, status: str, s: dict | None = None, timeout: float = -1) -> None:
        """The rank ended with ``status``: the textfile's last write says so, with sample
        ``s`` (a fresh one when None). Once; ``timeout``: how long to wait for a write in
        progress (a failing rank does not wait long)."""
        if self.ended is not None:
            return
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self.ended = (status, time.time())
        self._stop.set()
        if s is None:
            s = self.sample()
            self.samples.append(s)
        self._textfile(s, timeout)

    def write_prometheus(self, s: dict) -> None:
        from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

        registry = CollectorRegistry()
        labels = self.labels
        names = list(labels)

        def gauge(name: str, doc: str, value: float) -> None:
            Gauge(name, doc, names, registry=registry).labels(**labels).set(value)

        gauge("hpcsuite_step", "optimizer steps done by the job", s["step"])
        gauge("hpcsuite_job_running", "1 while the rank trains, 0 once it has ended (the "
              "values are then its last)", 0 if self.ended else 1)
        if self.ended:
            status, at = self.ended
            gauge("hpcsuite_job_end_time_seconds", "when the rank ended, Unix time", at)
            Gauge("hpcsuite_job_ended", "1, labelled with how the rank ended: completed, "
                  "preempted, time_limit, stopped or failed", [*names, "status"],
                  registry=registry).labels(**labels, status=status).set(1)
        gauge("hpcsuite_cpu_percent", "the rank's CPU use, percent of one core", s["cpu_percent"])
        gauge("hpcsuite_rss_bytes", "the rank's resident memory", s["rss_bytes"])
        if "gpu_percent" in s:
            gauge("hpcsuite_gpu_utilization_percent", "the rank's GPU utilisation", s["gpu_percent"])
            gauge("hpcsuite_gpu_memory_used_bytes", "the rank's GPU memory in use",
                  s["gpu_memory_bytes"])
        own, wait, slow = self.balance
        if own is not None:
            gauge("hpcsuite_step_own_seconds", "the rank's own work per step (data, forward, "
                  "backward, optimizer), at its last vote", own)
            gauge("hpcsuite_step_wait_seconds", "the rank's wait per step in the gradients' "
                  "allreduce, at its last vote", wait)
        if self.rank == 0 and own is not None:
            gauge("hpcsuite_slow_rank", "the rank the others wait for (runs/stragglers.py's "
                  "rule), -1 for none", slow["rank"] if slow else -1)
        write_to_textfile(str(self.prom_path), registry)   # a temporary file, then a rename


SHARED_SAMPLES = 120    # a rank's samples in results.json and the other ranks' charts


def thinned(samples: list[dict], at_most: int = SHARED_SAMPLES) -> list[dict]:
    """At most ``at_most`` of ``samples``, evenly spaced, the first and the last kept: what a
    rank hands rank 0 (results.json, TensorBoard). A sample a second for a day is 86,400 a
    rank; every rank's full series, at 1,000 ranks, was ~0.5 GB on rank 0 for each hour
    trained. The full series stays in the rank's own record (``rank-N.json``)."""
    if len(samples) <= at_most:
        return list(samples)
    last = len(samples) - 1
    return [samples[round(i * last / (at_most - 1))] for i in range(at_most)]


def end_all(status: str) -> None:
    """Every sampler of this process still running ends with ``status`` (a rank about to
    exit on a failure: its textfile says the job ended, not running at its last sample).
    Never raises: the rank is failing already."""
    for sampler in list(_ACTIVE):
        try:
            sampler.finish(status, timeout=1.0)
        except Exception as e:  # noqa: BLE001 - the failure being reported comes first
            log.warning("train.monitor: could not write the end (%s)", e)


def nvml_handle(nvml, device: str):
    """NVML's handle of torch's ``cuda:N``. CUDA counts only the devices CUDA_VISIBLE_DEVICES
    names (placement leaves a rank one, so it is cuda:0), NVML every device the node shows: the
    N-th visible entry is the GPU, by NVML index or by UUID (``GPU-...``, ``MIG-...``)."""
    from ..rank.placement import visible_devices

    index = int(device.split(":")[1]) if ":" in device else 0
    visible = visible_devices()
    if index < len(visible):
        ident = visible[index]
        if ident.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(ident))
        return nvml.nvmlDeviceGetHandleByUUID(ident)
    return nvml.nvmlDeviceGetHandleByIndex(index)
