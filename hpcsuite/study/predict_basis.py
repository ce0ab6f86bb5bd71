"""What `study predict STUDY` rests on beyond the workload: each allocation's own measured
computation, and the report's flags on the points it reads.

* **computation** (:func:`allocation_computes`): at N nodes the step model's ranks compute as
  the study's no-communication limit on N nodes of ``--gpus-per-node`` ranks did, where it
  measured one at the workload's per-rank batch; else as the workload's step (one rank). On a
  loaded machine a 2-node limit took 1.4-1.6x the 1-node step (the ranks fought for the CPU);
  fed the 1-node step, the prediction put the 2-node efficiency 7-11 points above what was
  measured.
* **flags** (:func:`flagged`): a configuration the study's report flags (repeats that
  disagree, a limit that did not grow with the ranks: :func:`hpcsuite.study.report.flags`)
  measured something other than the workload, and a prediction fed with its points inherits
  that. Each one read is named in a warning line and in the JSON's ``flagged``.

Light: the report's measurement rows only (:func:`hpcsuite.study.report.measure`), not its
allreduce fits (numpy).
"""

from __future__ import annotations

import statistics

from .predict import Workload


def basis(target: str | None, workload: Workload, gpus_per_node: int,
          nodes: list[int]) -> dict:
    """``computes`` (node count -> seconds per micro-batch, for
    :func:`~hpcsuite.study.predict.predict`), ``compute_from`` (node count -> the
    configurations whose limits gave it), ``flagged`` and ``warnings``; empty without a
    study."""
    if not target:
        return {"computes": {}, "compute_from": {}, "flagged": [], "warnings": []}
    from .points import open_study
    from .predict_io import study_workload

    sd = open_study(target)
    measured = allocation_computes(sd, workload, gpus_per_node, nodes)
    read = set(study_workload(target, workload.backward_fraction, workload.batch)[1])
    for _, configs in measured.values():
        read |= set(configs)
    bad = flagged(sd, read)
    return {"computes": {n: s for n, (s, _) in measured.items()},
            "compute_from": {n: configs for n, (_, configs) in measured.items()},
            "flagged": bad, "warnings": [warning(f) for f in bad]}


def allocation_computes(sd, workload: Workload, gpus_per_node: int,
                        nodes: list[int]) -> dict[int, tuple[float, list[str]]]:
    """Node count -> (a rank's compute per micro-batch, the configurations measured): the
    median step of the study's no-communication limits on that many nodes of
    ``gpus_per_node`` ranks each, at the workload's per-rank batch (and gradient bytes, where
    they are recorded), per micro-batch. Only node counts in ``nodes``."""
    from .report import _results, throughput

    study, state = sd.study(), sd.state()
    found: dict[int, list[tuple[float, str]]] = {}
    for point in sd.points():
        n = int(point.axes["nodes"])
        if point.kind != "limit" or n not in nodes or \
                int(point.axes["tasks_per_node"]) != gpus_per_node:
            continue
        results = _results(sd, point, state.get(point.id, {}))
        measured = results and throughput(results, study.warmup_steps, study.steps)
        if not measured or int(results.get("batch_size_per_rank") or 1) != workload.batch:
            continue
        if results.get("gradient_bytes") and \
                float(results["gradient_bytes"]) != workload.gradient_bytes:
            continue
        found.setdefault(n, []).append((measured[1] / (results.get("grad_accumulation") or 1),
                                        point.config))
    return {n: (statistics.median(step for step, _ in got), sorted({c for _, c in got}))
            for n, got in sorted(found.items())}


def flagged(sd, configs: set[str]) -> list[dict]:
    """The configurations among ``configs`` that the study's report flags, with its flags."""
    from .report import measure

    return [{"config": r["config"], "axes": r["axes"], "ranks": r["ranks"],
             "flags": list(r["flags"])}
            for r in measure(sd) if r["config"] in configs and r["flags"]]


def warning(bad: dict) -> str:
    from .report import axes_label

    return (f"warning: this prediction reads {bad['config']} ({axes_label(bad['axes'])}), "
            f"which the study's report FLAGGED: {'; '.join(bad['flags'])}; what it measured, "
            "and so this prediction, cannot be trusted (run the study again with the nodes to "
            "itself)")
