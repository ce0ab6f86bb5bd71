"""The commands a job runs on its nodes: `train` on every rank, the hidden `preflight` step
and the batch script's `attempt begin` / `attempt end`."""

from __future__ import annotations

from pathlib import Path

import click

from . import FilePath, main
from ..runs.rundir import RunDir


@main.command()
@click.option("--job", "job_path", required=True, type=FilePath(dir_okay=False),
              help="The resolved job (job.json) the sbatch script wrote.")
def train(job_path):
    """In-job entry point: run Horovod training on this rank (launched by the template)."""
    from ..runtime.train import main as train_main

    train_main(job_path)


@main.command(hidden=True)
@click.option("--job", "job_path", required=True, type=FilePath(dir_okay=False),
              help="The resolved job (job.json) the sbatch script wrote.")
@click.option("--min-busbw-gbps", type=click.FloatRange(0, None), default=None,
              help="The bus bandwidth every node pair must reach (GB/s).")
def preflight(job_path, min_busbw_gbps):
    """In-job step before training (the spec's preflight): node pairs' allreduce bandwidth and
    each rank's GPU health; exit 2 naming what failed."""
    from ..runtime.checks.preflight_step import main as preflight_main

    raise click.exceptions.Exit(preflight_main(job_path, min_busbw_gbps))


@main.group(hidden=True)
def attempt():
    """In-job bookkeeping the batch script calls around each attempt (hpcsuite.runs.attempts)."""


def _attempt_job(run_dir: str):
    from ..runtime.rank.job_io import load_job

    return load_job(str(RunDir(run_dir).job))


@attempt.command("begin")
@click.option("--run-dir", required=True, type=FilePath(file_okay=False))
def attempt_begin(run_dir):
    """Before the ranks start: earlier attempts' records, the failure budget, the checkpoint
    directory's owner. Exits non-zero when the attempt must not run."""
    from ..errors import UserError
    from ..runs import attempts

    try:
        code = attempts.begin(Path(run_dir), _attempt_job(run_dir),
                              out=lambda line: click.echo(line, err=False))
    except (UserError, OSError) as e:
        # said in the job's log (exit 2) and kept where `status` and `submit --wait` read it
        raise UserError(attempts.begin_failed(Path(run_dir), e)) from None
    raise click.exceptions.Exit(code)


@attempt.command("end")
@click.option("--run-dir", required=True, type=FilePath(file_okay=False))
@click.option("--status", type=int, required=True, help="The launcher's exit status.")
def attempt_end(run_dir, status):
    """After the ranks ended: record the outcome, requeue when the spec allows it. Exits with
    the launcher's status."""
    import signal

    from ..runs import attempts
    from ..runs.mlflow_end import end_attempt as end_tracking

    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2"):   # the time limit's TERM must not cut the record
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    job = _attempt_job(run_dir)
    code = attempts.end(Path(run_dir), job, status, out=lambda line: click.echo(line))
    # The attempt's MLflow run ends as the attempt did: the one rank 0 left open, or, where
    # rank 0 never opened one, one made now (after a requeue too: the next attempt continues
    # the run, so a close cut short by the requeue loses nothing). Never fails the script.
    end_tracking(job, Path(run_dir), out=lambda line: click.echo(line))
    raise click.exceptions.Exit(code)
