"""The job's preflight step as the batch script runs it: its command line, and the bus bandwidth
each node pair must reach (``preflight.fabric.min_busbw_gbps``, or the site's share of its
fabric). The ranks' side is :mod:`hpcsuite.runtime.checks.preflight_step`."""

from __future__ import annotations

from ..errors import UserError
from ..fabrics import preflight_bar_GBps
from ..runs import rundir
from ..shell import Raw

def problems(job, profile) -> list[tuple[str, str]]:
    """(key, why) of each preflight setting this site cannot run; empty when it can."""
    out = []
    fabric, r = job.preflight.fabric, job.resources
    if fabric is not None and fabric.min_busbw_gbps == "site" and profile.fabric is None:
        out.append(("preflight.fabric.min_busbw_gbps", "site, but the site profile names no "
                    "fabric (a preset or {bandwidth, latency}); give a number in GB/s"))
    if job.preflight.gpu and not (r.gpus_per_node or r.gpus_per_task):
        out.append(("preflight.gpu", "the job asks for no GPU (resources.gpus_per_node or "
                    "gpus_per_task); set it to false"))
    return out


def check_site(job, profile, origins: dict[str, str], source_of) -> None:
    """Refuse the first of :func:`problems`, naming the file that set the key, or for a bar
    left at its default the file that turned the step on (``source_of``: key -> file)."""
    from ..errors import ConfigError

    for key, message in problems(job, profile)[:1]:
        set_by = sorted((k != f"job.{key}", k) for k, v in origins.items() if v != "builtin"
                        and k.startswith(f"job.{key.rsplit('.', 1)[0]}"))
        raise ConfigError(source_of(set_by[0][1] if set_by else f"job.{key}"), key, message)


def required_busbw_gbps(job, profile) -> float | None:
    """The busbw (GB/s) every node pair must reach; None when the job measures no fabric."""
    fabric = job.preflight.fabric
    if fabric is None:
        return None
    if fabric.min_busbw_gbps != "site":
        return float(fabric.min_busbw_gbps)
    bar = preflight_bar_GBps(profile.fabric)   # fabrics.PREFLIGHT_SHARE of the site's
    if bar is None:
        raise UserError(": ".join(problems(job, profile)[0]))
    return bar


def args(job, profile) -> list[object] | None:
    """``-m hpcsuite preflight ...`` for every rank (the launcher and the interpreter go in
    front); None when the job has no preflight."""
    if not job.preflight.enabled:
        return None
    for key, why in problems(job, profile):
        raise UserError(f"{key}: {why}")
    out: list[object] = ["-m", "hpcsuite", "preflight", "--job", Raw(rundir.in_shell(rundir.JOB))]
    bar = required_busbw_gbps(job, profile)
    if bar is not None:
        out += ["--min-busbw-gbps", f"{bar:g}"]
    return out
