"""`hpcsuite bench`: measurements of the cluster itself, run as ordinary jobs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

from . import (FilePath, emit_json, main, prepare_request, profile_option, remote_option,
               set_option)
from ..errors import JobFailed, UserError, count


@main.group()
def bench():
    """Measure the cluster: collective bandwidth and latency, as ordinary Slurm jobs."""


@bench.command()
@click.option("--nodes", type=click.IntRange(1, 100000), default=2, show_default=True,
              help="Nodes to allocate.")
@click.option("--tasks-per-node", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Ranks per node.")
@click.option("--sizes", "sizes_text", metavar="LIST", default=None,
              help="Message sizes in bytes, comma-separated, K/M/G = 1024^1..3, multiples of 4 "
                   "(float32), e.g. 4,1K,64K,1M,16M. Default: 4 B to 64 MiB in powers of 4.")
@click.option("--budget", type=click.FloatRange(0.01, 60), default=0.4, show_default=True,
              help="Seconds of timed calls per size and library (the iteration count adapts).")
@click.option("--partition", default=None, help="Slurm partition (default: the profile's).")
@click.option("--time", "time_limit", default=None, metavar="WALLTIME",
              help="Walltime, e.g. 00:05:00 (default: the profile's or the spec default).")
@profile_option
@set_option
@click.option("--output-dir", default="runs", show_default=True, type=FilePath(file_okay=False),
              help="Where the job spec (allreduce-bench.yaml) and the run directory "
                   "(allreduce-bench/JOBID/) go, relative to the current directory.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow the job and print the results, or print the job id and return.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def allreduce(nodes, tasks_per_node, sizes_text, budget, partition, time_limit, profile_path,
              sets, output_dir, wait, as_json):
    """Time allreduce with Horovod and with MPI itself, on one allocation.

    Submits a job (through the same checks as `hpcsuite submit`) whose ranks sum float32
    tensors of each size in place with Horovod (horovod.torch allreduce_, op=Sum, CPU tensors)
    and, before and after it, with MPI's own allreduce (mpi4py, comm.Allreduce(MPI.IN_PLACE,
    ...), the call Horovod itself makes). Per size and library: warm-up, then repeated timed
    runs after a barrier; a run's time is the slowest rank's mean per call, the result is the
    median run. A lone Horovod allreduce waits for Horovod's next cycle (1 ms unless --set
    train.horovod.cycle_time_ms=...), which bounds its small-message latency.

    \b
    Printed per size, for both: time t, bus bandwidth, and their ratio
    (nccl-tests' definitions; S: bytes per rank, N: ranks):
      algbw = S / t
      busbw = algbw * 2(N-1)/N   (what each link carries in a ring allreduce)
    then the ring model t(S) = 2(N-1)*alpha + 2(N-1)/N * S/B fitted to each
    (alpha: latency per step; B: link bandwidth, the busbw of large messages).

    The run directory gets allreduce.json (everything, including the fits) and allreduce.csv.
    """
    from .. import runner
    from ..allreduce_sizes import DEFAULT_SIZES, parse_sizes
    from ..study.allreduce_job import NAME, job_spec
    from ..submit.spec import NAME as NAME_PATTERN, PATH, WALLTIME

    sizes = list(DEFAULT_SIZES)
    if sizes_text is not None:
        try:
            sizes = parse_sizes(sizes_text)
        except ValueError as e:
            raise UserError(f"--sizes: {e}") from None
    if nodes * tasks_per_node < 2:
        raise UserError("--nodes x --tasks-per-node: an allreduce needs at least 2 ranks")
    for option, value, pattern in (("--time", time_limit, WALLTIME),
                                   ("--partition", partition, NAME_PATTERN),
                                   ("--output-dir", output_dir, PATH)):
        if value is not None and not re.fullmatch(pattern, value):
            raise UserError(f"{option}: {value!r} is not a valid {option[2:]}")

    spec = job_spec(sizes, nodes, tasks_per_node, output_dir, time_limit, partition, budget)
    spec_path = _write_spec(Path(output_dir) / f"{NAME}.yaml", spec)
    # The same checks and rendering as `hpcsuite submit`.
    done = runner.submit(prepare_request(str(spec_path), profile_path, None, sets))
    if not wait:
        if as_json:
            emit_json({"job_id": done.job_id, "run_dir": done.run_dir, "spec": str(spec_path)})
        else:
            click.echo(done.job_id)
        return
    if not as_json:
        click.echo(f"submitted job {done.job_id}; run directory {done.run_dir}", err=True)
    state, report = _wait(done.job_id, done.run_dir, as_json)
    if as_json:
        emit_json({"job_id": done.job_id, "state": state, "run_dir": done.run_dir,
                   "spec": str(spec_path), "allreduce": report, "fit_check": _fit_checks(report),
                   "preflight": _preflight(report, done.run_dir)})
    else:
        click.echo(_table(report, done.job_id, done.run_dir))


def _write_spec(path: Path, spec: dict) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `hpcsuite bench allreduce`; rewritten on every run.\n"
                    + yaml.safe_dump(spec, sort_keys=False))
    return path


def _wait(job_id: str, run_dir: str, as_json: bool) -> tuple[str, dict]:
    """Follow the job (a line per state) to its end; (its state, its allreduce.json)."""
    from ..runner import FAILED, INPUT_ERROR, NEVER_STARTS, wait
    from ..runs.rundir import ALLREDUCE as REPORT

    t0 = time.monotonic()
    seen = {"state": None}

    def changed(record):
        if not as_json and record.state.state != seen["state"]:
            seen["state"] = record.state.state
            click.echo(f"[{time.monotonic() - t0:6.1f}s] job {job_id}: {record.state.state}",
                       err=True)

    outcome = wait(job_id, run_dir, on_progress=changed)
    if outcome.exit_class in (FAILED, INPUT_ERROR):
        raise JobFailed(outcome.failure())
    if outcome.exit_class == NEVER_STARTS:
        raise outcome.error()
    path = Path(run_dir) / REPORT
    if not path.is_file():
        from ..runner import tail

        raise JobFailed(f"job {job_id} completed without writing {path}; last lines of "
                        f"{outcome.log}:\n{tail(Path(outcome.log))}")
    return outcome.state.state, json.loads(path.read_text())


def _seconds(s: float) -> str:
    s = float(f"{s:.3g}")       # round first, so 999.9 us reads 1 ms
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def _rate(bps: float) -> str:
    bps = float(f"{bps:.3g}")
    for unit, factor in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= factor:
            return f"{bps / factor:.3g} {unit}"
    return f"{bps:.3g} B/s"


def _table(report: dict, job_id: str, run_dir: str) -> str:
    from ..alphabeta import MODEL, AlphaBeta, FitError
    from ..allreduce_sizes import format_size
    from ..runs.rundir import ALLREDUCE as REPORT, ALLREDUCE_CSV as CSV

    hosts = ", ".join(dict.fromkeys(report["hosts"]))
    lines = [f"allreduce on {count(report['world_size'], 'rank')} ({hosts}), job {job_id}; "
             f"busbw = S/t * 2(N-1)/N"]
    head = ("size", "Horovod time", "Horovod busbw", "MPI time", "MPI busbw", "Horovod/MPI")
    rows = [head] + [(format_size(p["bytes"]), _seconds(p["horovod_s"]), _rate(p["horovod_busbw"]),
                      _seconds(p["mpi_s"]), _rate(p["mpi_busbw"]), f"{p['busbw_ratio']:.3f}")
                     for p in report["points"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(f"alpha-beta fit, {MODEL}:")
    checks = _fit_checks(report)
    for key, label in (("horovod", "Horovod"), ("mpi", "MPI")):
        try:
            lines.append(f"  {label + ':':8} {AlphaBeta.from_json(report['fit'][key]).in_words()}")
        except FitError as e:
            lines.append(f"  {label + ':':8} no fit: {e}")
        if key in checks:
            lines += [f"  {'':8} {line}" for line in _check_lines(checks[key])]
    bar = _preflight(report, run_dir)
    if bar:
        lines.append(f"preflight: MPI busbw {bar['mpi_busbw_GBps']:.3g} GB/s at "
                     f"{format_size(bar['bytes'])}; a job's preflight.fabric (min_busbw_gbps: "
                     f"site) asks {bar['bar_GBps']:.3g} GB/s of each node pair: "
                     f"{'reached' if bar['reached'] else 'NOT reached'}")
    lines.append(f"results: {Path(run_dir) / REPORT}, {Path(run_dir) / CSV}")
    return "\n".join(lines)


def _fit_checks(report: dict) -> dict:
    """Each library's :func:`hpcsuite.alphabeta.fit_check` (the fit against its large sizes'
    busbw), where it has a fit."""
    from ..alphabeta import AlphaBeta, FitError, fit_check

    out = {}
    for key in ("horovod", "mpi"):
        rows = [p for p in report.get("points", []) if p.get(f"{key}_s")]
        try:
            model = AlphaBeta.from_json(report["fit"][key])
            out[key] = fit_check(model, [p["bytes"] for p in rows],
                                 [p[f"{key}_s"] for p in rows], int(report["world_size"]))
        except (FitError, KeyError, TypeError, ValueError):
            continue
    return out


def _check_lines(check: dict) -> list[str]:
    from ..allreduce_sizes import format_size
    from ..alphabeta import LARGE_BYTES

    large, lines = check["large_busbw"], []
    if large:
        lines.append(f"busbw of {format_size(large['least_bytes'])} and up: "
                     f"{_rate(large['median_Bps'])} (median of {large['sizes']} sizes, "
                     f"{_rate(large['min_Bps'])} to {_rate(large['max_Bps'])})")
    if check["poor"]:
        lines.append(f"POOR FIT (max error {check['max_rel_error']:.1%}, over "
                     f"{check['bar']:.0%}): " +
                     (f"use the large sizes' busbw, {_rate(large['median_Bps'])}, not the fit's B"
                      if large else f"no size of {format_size(LARGE_BYTES)} or more to read the "
                      "busbw from; measure larger sizes"))
    return lines


def _preflight(report: dict, run_dir: str) -> dict | None:
    """The largest size's MPI busbw against the bar a job's preflight (``min_busbw_gbps:
    site``) sets from the site's fabric (the profile.json submit wrote); None without one.
    With 2 nodes of 1 rank this is the allreduce the preflight times for their pair."""
    from ..fabrics import preflight_bar_GBps
    from ..runs.rundir import RunDir

    try:
        bar = preflight_bar_GBps(json.loads(RunDir(run_dir).profile.read_text()).get("fabric"))
    except (OSError, ValueError, KeyError):
        return None
    if bar is None or not report.get("points"):
        return None
    top = report["points"][-1]
    return {"bar_GBps": bar, "bytes": top["bytes"], "mpi_busbw_GBps": top["mpi_busbw"] / 1e9,
            "reached": top["mpi_busbw"] >= bar * 1e9}
