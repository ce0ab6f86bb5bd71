"""Job commands: render, submit, status, logs, cancel, train."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from . import FilePath, emit_json, main, profile_option, set_option, template_dir_option
from ..errors import JobFailed, JobPreempted, UserError

spec_argument = click.argument("spec", type=FilePath(dir_okay=False))
def _plan(spec: str, profile_path: str | None, template_dir: str | None, sets=()):
    from ..config import resolve
    from ..plan import plan
    from ..templating import SearchPath

    from ..lint import enforce, lint

    r = resolve(spec, profile_path, sets)
    for warning in enforce(lint(r.job, r.profile), spec):
        click.echo(f"{spec}: {warning}", err=True)
    site_only = "template" in r.locks
    return plan(r.job, r.profile, SearchPath.default(template_dir, site_only=site_only), r.locks)


@main.command()
@spec_argument
@profile_option
@template_dir_option
@set_option
@click.option("--json", "as_json", is_flag=True, help="Print script and sbatch command as JSON.")
def render(spec, profile_path, template_dir, sets, as_json):
    """Print the sbatch script SPEC renders to (nothing is submitted)."""
    request = _plan(spec, profile_path, template_dir, sets)
    if as_json:
        emit_json(request.to_json())
    else:
        click.echo(request.script, nl=False)


@main.command()
@spec_argument
@profile_option
@template_dir_option
@set_option
@click.option("--dry-run", is_flag=True, help="Print the script and sbatch command; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit 1 if it failed.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(spec, profile_path, template_dir, sets, dry_run, wait, timeout, as_json):
    """Submit SPEC to Slurm with sbatch and print the job id."""
    from ..plan import submit as do_submit

    request = _plan(spec, profile_path, template_dir, sets)
    if dry_run:
        if as_json:
            emit_json(request.to_json())
        else:
            click.echo(request.script, nl=False)
            click.echo("# " + " ".join([*request.sbatch_argv, "<script>"]))
        return
    done = do_submit(request)
    if not wait:
        if as_json:
            emit_json({"job_id": done.job_id, "run_dir": done.run_dir})
        else:
            click.echo(done.job_id)
        return
    if not as_json:
        click.echo(f"submitted job {done.job_id}; run directory {done.run_dir}")
    _wait_and_report(done.job_id, done.run_dir, timeout, as_json)


def _wait_and_report(job_id: str, run_dir: str, timeout: float | None, as_json: bool) -> None:
    from .. import jobs
    from ..results import RESULTS, Results, summarize

    t0 = time.monotonic()

    def changed(state):
        if not as_json:
            click.echo(f"[{time.monotonic() - t0:6.1f}s] job {job_id}: {state.state}", err=True)

    state = jobs.wait(job_id, timeout=timeout, on_change=changed)
    path = Path(run_dir) / RESULTS
    results = Results.load(path) if path.is_file() else None
    if as_json:
        payload = {"job_id": job_id, "state": state.state, "run_dir": run_dir}
        if results is not None:
            payload["results"] = results.to_json()
        emit_json(payload)
    if not state.ok:
        log = jobs.log_path(state) or Path(run_dir).parent / f"slurm-{job_id}.out"
        raise JobFailed(f"job {job_id} ended {state.state} (exit {state.exit_code}); "
                        f"last lines of {log}:\n{jobs.tail(log)}")
    if not as_json:
        click.echo(summarize(run_dir) if results is not None else
                   f"job {job_id} completed; no results.json in {run_dir}")
    if results is not None and results.status == "preempted":
        raise JobPreempted(f"job {job_id} stopped early after saving a checkpoint; "
                           "submit the same spec again to resume")


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(job_id, as_json):
    """Show the state of job JOB_ID."""
    from .. import jobs

    state = jobs.query(job_id)
    if as_json:
        emit_json(state.to_json())
    else:
        extra = f" ({state.reason})" if state.reason and state.reason != "None" else ""
        click.echo(f"{state.job_id} {state.state}{extra} exit={state.exit_code or '-'}")


@main.command()
@click.argument("job_id")
@click.option("-n", "--lines", type=int, default=None, help="Only the last N lines.")
def logs(job_id, lines):
    """Print the Slurm output file of job JOB_ID."""
    from .. import jobs

    state = jobs.query(job_id)
    path = jobs.log_path(state)
    if path is None or not path.is_file():
        raise UserError(f"job {job_id} has no output file yet ({path or 'unknown path'})")
    text = path.read_text(errors="replace")
    if lines is not None:
        text = "\n".join(text.splitlines()[-lines:]) + "\n"
    click.echo(text, nl=False)


@main.command()
@click.argument("job_id")
def cancel(job_id):
    """Cancel job JOB_ID."""
    from .. import jobs

    jobs.cancel(job_id)
    click.echo(f"cancelled {job_id}")


@main.command()
@click.option("--job", "job_path", required=True, type=FilePath(dir_okay=False),
              help="The resolved job (job.json) the sbatch script wrote.")
def train(job_path):
    """In-job entry point: run Horovod training on this rank (launched by the template)."""
    from ..runtime.train import main as train_main

    train_main(job_path)
