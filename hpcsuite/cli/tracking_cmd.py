"""`hpcsuite tracking`: MLflow runs, from the file store the jobs wrote into a tracking server
or database (:mod:`hpcsuite.runs.mlflow_sync`). MLflow is imported when a sync runs."""

from __future__ import annotations

from pathlib import Path

import click

from . import Group, emit_json, main


@main.group(cls=Group)
def tracking():
    """MLflow runs of jobs with train.tracking.mlflow."""


@tracking.command("sync")
@click.argument("target", metavar="RUN|SWEEP|STUDY")
@click.option("--to", "to", required=True, metavar="URI",
              help="Where to copy the runs: http(s)://HOST[:PORT] (an MLflow tracking server) "
                   "or sqlite:///PATH (a database, made when missing; `mlflow ui "
                   "--backend-store-uri sqlite:///PATH` shows it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sync(target, to, as_json):
    """Copy the MLflow runs of RUN (a job id, a run directory, or a job name: its latest run),
    of a SWEEP's elements (its directory, or its job array's id) or of a STUDY's points (its
    directory) into a tracking server or a SQLite database: params, tags, every metric's whole
    history, artifacts, and each run's status, start and end times.

    \b
    Jobs log to a file store on the shared filesystem (no server needed on the compute
    nodes); run this on the login node, as often as you like: each copy carries the tag
    hpcsuite.source_run_id, and a second sync adds only what is new (nothing for a run that
    has not changed). Exit 1 when a run could not be copied."""
    from ..runs.mlflow_sync import sync as sync_runs

    done = sync_runs(run_dirs(target), to)
    if as_json:
        emit_json([d.to_json() for d in done])
    else:
        for d in done:
            click.echo(d.line())
    if any(d.error for d in done):
        raise click.exceptions.Exit(1)


def run_dirs(target: str) -> list[Path]:
    """The run directories TARGET names: a run directory; a sweep directory (its elements'
    newest runs); a study directory (its points' runs); else a run as `status` takes it, an
    array job's id or a sweep's name standing for its sweep."""
    from ..runs import registry
    from ..runs.rundir import RunDir
    from ..study.points import POINTS_FILE, open_study
    from ..sweep.sweepdir import ELEMENTS_FILE

    path = Path(target)
    if path.is_dir() and (RunDir(path).mlflow.is_file() or RunDir(path).job.is_file()):
        return [path]
    if path.is_dir() and (path / ELEMENTS_FILE).is_file():
        return sweep_runs(path)
    if path.is_dir() and (path / POINTS_FILE).is_file():
        sd = open_study(target)
        state = sd.state()
        return [sd.run_dir(p, str(state[p.id]["job_id"])) for p in sd.points()
                if state.get(p.id, {}).get("job_id")]
    _, entry = registry.locate(Path.cwd(), target)
    if entry is not None and entry.get("array"):
        return sweep_runs(Path(entry["array"]["sweep_dir"]))
    if entry is None or not entry.get("run_dir"):
        from ..errors import UserError

        raise UserError(f"{target}: no run directory known (not submitted from here); give "
                        "its run directory")
    return [Path(entry["run_dir"])]


def sweep_runs(path: Path) -> list[Path]:
    from ..sweep.sweepdir import open_sweep

    sd = open_sweep(str(path))
    return [sd.run_dir(element) for _, (element, _) in sorted(sd.current_jobs().items())]
