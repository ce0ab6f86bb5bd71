"""The allreduce benchmark's job, built on the login node: one script-mode job spec whose
``train.script`` is the rank program, :mod:`hpcsuite.runtime.checks.allreduce_bench`, run on every
rank. Used by `hpcsuite bench allreduce` and by a study's benchmark points.

The rank program is named by its path, not imported: it is compute-node code (mpi4py,
Horovod, torch), and the job runs the file that this installation of hpcsuite holds.
"""

from __future__ import annotations

from pathlib import Path

from ..allreduce_sizes import DEFAULT_BUDGET_S

NAME = "allreduce-bench"
SCRIPT = Path(__file__).resolve().parent.parent / "runtime" / "checks" / "allreduce_bench.py"


def job_spec(sizes: list[int] | None, nodes: int, tasks_per_node: int, output_dir: str,
             time_limit: str | None = None, partition: str | None = None,
             budget_s: float | None = DEFAULT_BUDGET_S, *, name: str = NAME,
             base=None) -> dict:
    """The one builder of the script-mode job that runs :data:`SCRIPT` on every rank, for
    `hpcsuite bench allreduce` and for a study's benchmark points. Keys the site may decide
    (partition, walltime, CPUs per task) are left to the profile unless given, or taken from
    ``base`` (a study's base JobSpec: its partition, walltime, CPUs, memory, environment and
    launcher, so the benchmark runs where the training does). ``sizes`` and ``budget_s`` None:
    the rank program's defaults. Checkpoints are off whatever a profile layer says: a
    benchmark has nothing to resume."""
    resources: dict = {"nodes": int(nodes), "tasks_per_node": int(tasks_per_node)}
    if base is not None:
        r = base.resources
        resources.update(time=r.time, cpus_per_task=r.cpus_per_task)
        resources.update({k: getattr(r, k) for k in ("partition", "mem") if getattr(r, k)})
    if time_limit:
        resources["time"] = time_limit
    if partition:
        resources["partition"] = partition
    train: dict = {"backend": "torch", "script": str(SCRIPT)}
    args = (["--sizes", ",".join(str(s) for s in sizes)] if sizes is not None else []) + \
        (["--budget", f"{budget_s:g}"] if budget_s is not None else [])
    if args:
        train["args"] = args
    train["checkpoint"] = {"every_steps": 0, "every_minutes": 0, "resume": False}
    spec = {"name": name, "output_dir": output_dir, "resources": resources, "train": train}
    if base is not None and base.env:
        spec["env"] = dict(base.env)
    if base is not None:
        spec["launcher"] = base.launcher
    return spec
