"""`hpcsuite train`: what every rank runs inside the job."""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import sys
from pathlib import Path

from ..errors import UserError
from ..results import write_json_atomic
from ..spec import JobSpec, spec_from_dict

log = logging.getLogger(__name__)


def load_job(path: str) -> JobSpec:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    return spec_from_dict(data, path)


def step_stats(times: list[float]) -> dict:
    if not times:
        return {"count": 0, "mean": 0.0, "median": 0.0, "p90": 0.0, "min": 0.0, "max": 0.0}
    ordered = sorted(times)
    return {"count": len(times), "mean": statistics.fmean(times), "median": statistics.median(times),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "min": ordered[0], "max": ordered[-1]}


def hostname() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def make_backend(job: JobSpec):
    if job.train.backend == "tensorflow":
        from .tf_backend import TensorFlowBackend
        return TensorFlowBackend(job)
    from .torch_backend import TorchBackend
    return TorchBackend(job)


def main(job_path: str) -> None:
    from .loop import PREEMPTED_MARKER, Trainer

    job = load_job(job_path)
    run_dir = Path(os.environ.get("HPCSUITE_RUN_DIR") or Path(job_path).parent)
    backend = make_backend(job)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank {backend.rank} %(name)s: %(message)s",
                        force=True)   # the CLI configured WARNING level for login-node use
    try:
        report = Trainer(job, run_dir, backend).run()
    finally:
        backend.shutdown()
    rank = report["rank"]
    write_json_atomic(run_dir / f"rank-{rank}.json", report["per_rank"])
    if rank != 0:
        return
    from .. import slurm

    results = report["results"]
    results["job_id"] = os.environ.get("SLURM_JOB_ID")
    results["attempt"] = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    done = slurm.call(["srun", "--version"], check=False, timeout=10, env=dict(os.environ))
    results["versions"]["slurm"] = done.stdout.strip() or None
    results["versions"]["python"] = sys.version.split()[0]
    write_json_atomic(run_dir / "results.json", results)
    marker = run_dir / PREEMPTED_MARKER
    if results["status"] == "preempted":
        marker.write_text(f"{results['final_step']}\n")
    else:
        marker.unlink(missing_ok=True)
    print(f"hpcsuite train: {results['status']} at step {results['final_step']}; wrote "
          f"{run_dir / 'results.json'} ({results['samples_per_s']:.1f} samples/s on "
          f"{results['world_size']} ranks)", flush=True)
