"""What a run's GPUs did, read from results.json: whether they were starved, and their energy.

The starved-GPU rule (:func:`gpu_verdict`) is a pure function of what ``train.monitor``
recorded: each rank's NVML utilisation samples (``gpu_percent``: the share of the last sample
period in which a kernel ran), the managed loop's ``data_wait_fraction`` (rank 0's time waiting
for its next batch, over its step time) and the step times. The thresholds:

- the samples read are those taken after the attempt's first step ended (model building,
  autotuning and the first step's compilation are not training), pooled over the ranks, at
  least :data:`MIN_SAMPLES` of them and :data:`MIN_STEPS` steps; else no verdict;
- the GPU is *busy* when their median is at least :data:`BUSY_BELOW` percent: nothing is said;
- below it, with at least :data:`WAIT_AT_LEAST` of the step spent waiting for data, it is
  *starved*: the input pipeline is late, and more loader workers or a deeper prefetch feed it;
- below it with less waiting, it is *underused*: the step itself (small kernels, Python, the
  allreduce) leaves it idle, which input settings do not change; a larger batch per rank gives
  each step more GPU work. Both numbers are named either way, so a reader can judge.
"""

from __future__ import annotations

import statistics

from .results import Results

BUSY_BELOW = 50.0        # median GPU busy %, below which a GPU is not kept busy
WAIT_AT_LEAST = 0.10     # share of the step waiting for data that makes it the input's fault
MIN_SAMPLES = 3          # fewer training samples than this: too short to tell
MIN_STEPS = 10


def training_gpu_percent(utilisation: list[list[dict]], start_step: int = 0) -> list[float]:
    """Every rank's ``gpu_percent`` samples taken after the attempt's first step ended."""
    return [float(s["gpu_percent"]) for series in utilisation for s in series
            if isinstance(s, dict) and isinstance(s.get("gpu_percent"), (int, float))
            and isinstance(s.get("step"), int) and s["step"] > start_step]


def gpu_verdict(utilisation: list[list[dict]], data_wait_fraction: float,
                step_times: list[float], start_step: int = 0) -> dict | None:
    """{kind: starved | underused | busy, busy_percent, data_wait_fraction, samples, line}
    (line: None when busy), or None when the run recorded too little to tell (no GPU samples,
    fewer than MIN_SAMPLES of them or MIN_STEPS steps)."""
    samples = training_gpu_percent(utilisation, start_step)
    if len(samples) < MIN_SAMPLES or len(step_times) < MIN_STEPS:
        return None
    busy = statistics.median(samples)
    wait = float(data_wait_fraction)
    said = f"GPU {busy:.0f} % busy, {100 * wait:.0f} % of the step waiting for data"
    if busy >= BUSY_BELOW:
        kind, line = "busy", None
    elif wait >= WAIT_AT_LEAST:
        kind, line = "starved", f"{said}: raise train.data.workers / train.data.prefetch"
    else:
        kind, line = "underused", (f"{said}: the input keeps up, the step itself leaves the GPU "
                                   "idle (small kernels, Python, the allreduce); a larger "
                                   "train.batch_size per rank gives it more work")
    return {"kind": kind, "busy_percent": busy, "data_wait_fraction": wait,
            "samples": len(samples), "line": line}


def energy_line(r: Results) -> str | None:
    """The GPUs' energy over the attempt in words, or None when none was recorded."""
    if r.energy_j is None:
        return None
    gpus = sum(isinstance(j, (int, float)) for j in r.energy_j_per_rank) or 1
    per = (f", {r.samples_per_joule:.1f} samples/J" if r.samples_per_joule is not None else
           f" (of {len(r.energy_j_per_rank)} ranks' GPUs; the others did not report it)")
    return f"GPU energy {r.energy_j / 1000:.3g} kJ over {gpus} GPU(s){per}"


def gpu_lines(r: Results) -> list[str]:
    """What ``status`` and ``report`` say of a run's GPUs: starved or underused, and energy."""
    verdict = gpu_verdict(r.utilisation, r.data_wait_fraction, r.step_times_s, r.start_step)
    return [line for line in ((verdict or {}).get("line"), energy_line(r)) if line]
