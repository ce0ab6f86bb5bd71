"""A submitted run: `status`, `runs`, `logs`, `report`, `cancel`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from . import emit_json, main, remote_option
from ..errors import UserError
from ..runs.rundir import RunDir


def _find_run(run: str) -> tuple[str, dict | None]:
    from ..runs import registry

    return registry.locate(Path.cwd(), run)


def _run_dir_of(entry: dict | None) -> Path | None:
    return Path(entry["run_dir"]) if entry and entry.get("run_dir") else None


@main.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--wait", is_flag=True,
              help="Follow RUN to its end, as `submit --wait` does (its live line and exit "
                   "status): for a job submitted without --wait, or followed again.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS "
              "(the job goes on).")
@remote_option
def status(run, as_json, wait, timeout):
    """Show the state of RUN: a job id, a run directory, or a job name (its latest run).

    State, elapsed time, exit code, requeues and MaxRSS (from Slurm accounting, sacct, where
    the cluster keeps it; else from the controller or its job completion log), and from the run
    directory the latest step, epoch, throughput and loss (while it runs) or the results (when
    it has finished), what stopped it, and its attempts (a requeued job: how many were
    preempted or stopped at the time limit, how many failed, how the last one ended)."""
    from ..runner import describe

    if wait:
        from .submit_cmd import finish, follow

        job_id, entry = _find_run(run)
        run_dir = _run_dir_of(entry)
        if run_dir is None:
            raise UserError(f"{run}: no run directory known for it here (.hpcsuite/runs.jsonl); "
                            "--wait follows a job submitted from this directory")
        finish(follow(job_id, str(run_dir), timeout, as_json), as_json)
        return
    record = describe(run)
    if as_json:
        emit_json(record.to_json())
    else:
        click.echo("\n".join(record.lines()))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-n", "--last", type=int, default=20, show_default=True,
              help="Only the last N runs (0: all).")
@remote_option
def runs(as_json, last):
    """List the runs submitted from this directory, newest last, with their state; a sweep's
    job array is one line (NAME [elements]) followed by its elements (ARRAYID_INDEX).

    The registry is .hpcsuite/runs.jsonl here; states, exit codes and MaxRSS come from one
    sacct call for all the runs where the cluster keeps accounting, else from one squeue call
    (and Slurm's job completion records for the jobs the controller has forgotten). OUTCOME is
    the job's own record of its attempts (Slurm's COMPLETED is the batch script's end): e.g.
    "completed after 2 attempts (1 preempted)", "preempted at attempt 0, requeued", "failed
    at attempt 1 (exit 1)"."""
    from ..runs import registry
    from ..runner import describe_many

    entries = registry.load(Path.cwd())
    rows = [r.row() for r in describe_many(registry.expand(entries[-last:] if last else entries))]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no runs submitted from {Path.cwd()}")
        return
    click.echo(f"{'JOB':>10}  {'NAME':<20} {'STATE':<11} {'ELAPSED':>10} {'EXIT':>5} "
               f"{'MAXRSS':>7} {'STEP':>7}  {'OUTCOME':<30}  {'SUBMITTED':<19}  RUN DIR")
    for r in rows:
        name = r["name"] or ""
        if r.get("array"):          # a sweep's job array, its elements on the lines below it
            name = f"{name} [{len(r['array']['indices'])}]"
        click.echo(f"{r['job_id']:>10}  {name[:20]:<20} {r['state']:<11} "
                   f"{r['elapsed'] or '-':>10} {r['exit_code'] or '-':>5} {r['max_rss'] or '-':>7} "
                   f"{r['step'] if r['step'] is not None else '-':>7}  {r['outcome'] or '-':<30}  "
                   f"{r['submitted_at'] or '':<19}  {r['run_dir']}")


@main.command()
@click.argument("run")
@click.option("-n", "--lines", type=int, default=None, help="Only the last N lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--rank", type=int, default=None,
              help="Only rank N's log records (run directory logs/rank-N.log) instead of the "
                   "job's Slurm output file.")
@remote_option
def logs(run, lines, follow, rank):
    """Print the output of RUN (a job id, a run directory, or a job name)."""
    from .. import runner

    job_id, entry = _find_run(run)
    state = runner.state(job_id, entry)
    run_dir = _run_dir_of(entry)
    if rank is not None:
        if run_dir is None:
            raise UserError(f"job {job_id}: no run directory known for --rank (not submitted from "
                            "here); give its run directory")
        _check_rank(job_id, run_dir, rank)
        path = RunDir(run_dir).rank_log(rank)
    else:
        path = runner.slurm_log(job_id, state, run_dir)
    waiting = runner.waiting(state)
    if not follow and (path is None or not path.is_file()):
        if waiting:
            raise UserError(f"job {job_id} is waiting to start ({waiting[0]}): no output yet")
        raise UserError(f"job {job_id} has no output file yet ({path or 'unknown path'})")
    if follow and state.state == "PENDING":
        click.echo(f"job {job_id} is waiting to start" + (f" ({waiting[0]})" if waiting else "")
                   + "; its output follows once it runs", err=True)
    offset = 0
    if path is not None and path.is_file():
        text = path.read_text(errors="replace")
        offset = len(text.encode())
        if lines is not None:
            text = "\n".join(text.splitlines()[-lines:]) + ("\n" if text else "")
        click.echo(text, nl=False)
    if follow:
        _follow(job_id, path, offset, run_dir)


def _check_rank(job_id: str, run_dir: Path, rank: int) -> None:
    """Refuse a rank the job does not have (its job.json says how many it runs)."""
    from ..runtime.rank.job_io import load_job

    job_file = RunDir(run_dir).job
    if not job_file.is_file():
        return                     # a sweep element before it starts: not known yet
    size = load_job(str(job_file)).world_size
    if not 0 <= rank < size:
        raise UserError(f"job {job_id} has no rank {rank}: it runs {size} rank(s), "
                        f"0 to {size - 1}")


def _follow(job_id: str, path: Path | None, offset: int, run_dir: Path | None) -> None:
    """Print what is appended to ``path`` until the job has ended and the file is drained."""
    from .. import runner

    def drain() -> None:
        nonlocal offset
        if path is None or not path.is_file():
            return
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        if chunk:
            offset += len(chunk)
            click.echo(chunk.decode(errors="replace"), nl=False)

    try:
        runner.follow(job_id, run_dir, on_tick=drain)
    finally:
        time.sleep(0.5)   # the last lines reach the file as the job step ends
        drain()


@main.command()
@click.argument("run")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Directory for the PNGs (default: the run directory).")
@remote_option
def report(run, out):
    """Draw PNG plots of RUN (a job id, a run directory, or a job name) from its results:
    loss.png, throughput.png, and with train.monitor utilisation.png. Prints, for each Horovod
    timeline window (train.monitor.timeline_steps), the time per step of its activities,
    with train.monitor.tensorboard where the event files are and the `tensorboard` command,
    with train.monitor on GPUs their energy and whether they were starved for data, and each
    rank's own work and allreduce wait per step, naming a rank the others waited for. With
    train.tracking the plots are added to the run's MLflow run (report/). A script that
    completed without hpcsuite.api has no results to plot: report says so (exit 0)."""
    from ..runs.report import (gpu_findings, nothing_recorded, plot, slow_rank_findings,
                               tensorboard_line, timeline_line, timeline_summary,
                               timeline_windows)

    job_id, entry = _find_run(run)
    if entry is None:
        raise UserError(f"job {job_id}: no run directory known (not submitted from here); give "
                        "its run directory")
    said = nothing_recorded(Path(entry["run_dir"]), job_id)
    if said:            # not an error: the job did what its script does
        click.echo(said)
        return
    plots = plot(Path(entry["run_dir"]), Path(out) if out else None)
    for path in plots:
        click.echo(str(path))
    from ..runs.mlflow_store import add_plots     # imports mlflow only for a run that tracks
    tracked = add_plots(Path(entry["run_dir"]), plots)
    if tracked:
        click.echo(tracked)
    for window in timeline_windows(Path(entry["run_dir"])):
        click.echo(f"{window}\n  {timeline_line(timeline_summary(window))}")
    board = tensorboard_line(Path(entry["run_dir"]))
    if board:
        click.echo(board)
    for line in gpu_findings(Path(entry["run_dir"])) + slow_rank_findings(Path(entry["run_dir"])):
        click.echo(line)


@main.command()
@click.argument("run")
@remote_option
def cancel(run):
    """Cancel RUN (a job id, a run directory, or a job name: its latest run); for a job
    array, every element that still waits or runs. Exit 2 when there is nothing to cancel:
    the job has ended, was cancelled already, or Slurm does not know it."""
    from ..runner import cancel

    job_id, _ = _find_run(run)
    click.echo(cancel(job_id))
