"""`fetch`: a run's directory brought back from a remote (:mod:`hpcsuite.remote.fetch`)."""

from __future__ import annotations

from pathlib import Path

import click

from . import emit_json, main
from ..errors import UserError


@main.command()
@click.argument("run")
@click.option("--remote", "remote_name", envvar="HPCSUITE_REMOTE", metavar="NAME",
              help="The remote of ~/.config/hpcsuite/remotes.yaml the run was submitted to "
                   "(env: HPCSUITE_REMOTE). Required.")
@click.option("--checkpoints", is_flag=True,
              help="Also copy the run's checkpoints (the run root's checkpoints/, or the job's "
                   "train.checkpoint.dir) into DEST/NAME/checkpoints/; they can be large.")
@click.option("--to", "to", type=click.Path(file_okay=False), default="runs", show_default=True,
              metavar="DIR", help="Where the copy goes: DIR/NAME/JOBID.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fetch(run, remote_name, checkpoints, to, as_json):
    """Copy what RUN produced on the remote into the local runs/ layout, so that `status`,
    `report` and `tracking sync` (e.g. into an MLflow server on this machine) work on the copy.
    RUN is a job id or a job name (its latest run) as the remote's `hpcsuite status` knows it,
    or the absolute path of the run directory there.

    \b
    What is copied, to DIR/NAME/JOBID (DIR: --to, ./runs by default):
      every file of the run directory: results, attempts, logs, plots, reports, the job as
      submitted, mlflow.json, TensorBoard events (symlinks are not followed)
      DIR/NAME/slurm-JOBID.out: Slurm's log of the batch script
      DIR/NAME/mlruns/: the run's own MLflow run, when it logged to the job name's file
      store (the copy's mlflow.json then names the copy)
      DIR/NAME/checkpoints/: only with --checkpoints

    Resumable: only files missing here or changed there (size or mtime) are copied, in
    batches of about 64 MB; an interrupted fetch keeps each finished batch, leaves no partial
    file, and the next fetch copies only the rest. The copy is recorded once in
    ./.hpcsuite/runs.jsonl (with the remote's name and its run directory there). Prints the
    counts on stderr and the copy's directory on stdout. An unreachable host, a refused key,
    a full disk or a failing remote command: one line, exit 2."""
    from ..remote import config
    from ..remote.fetch import fetch as fetch_run
    from ..remote.ssh import Connection

    name = config.chosen(remote_name)
    if not name:
        raise UserError("fetch: --remote NAME is required (or HPCSUITE_REMOTE): the remote of "
                        f"{config.path()} the run was submitted to")
    done = fetch_run(Connection(config.load(name)), run, Path(to), checkpoints=checkpoints)
    if as_json:
        emit_json(done.to_json())
        return
    click.echo(done.line(), err=True)
    click.echo(done.run_dir)
