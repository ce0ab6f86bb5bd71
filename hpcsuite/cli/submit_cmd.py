"""`render` and `submit` (with `--wait`'s live line): a spec to its script, and to Slurm."""

from __future__ import annotations

import time

import click

from . import (FilePath, after_option, emit_json, main, prepare_request, profile_option,
               remote_option, set_option, template_dir_option)

spec_argument = click.argument("spec", type=FilePath(dir_okay=False))


@main.command()
@spec_argument
@profile_option
@template_dir_option
@set_option
@after_option
@click.option("--json", "as_json", is_flag=True, help="Print script and sbatch command as JSON.")
@remote_option
def render(spec, profile_path, template_dir, sets, after, as_json):
    """Print the sbatch script SPEC renders to (nothing is submitted)."""
    request = prepare_request(spec, profile_path, template_dir, sets, after=after)
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
@click.option("--wait", is_flag=True,
              help="Follow the job to its end; exit 1 if it failed, 2 if it failed on an input "
                   "error, 3 if it stopped after saving a checkpoint.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@click.option("--hold", is_flag=True,
              help="Submit the job held: it starts after `scontrol release JOBID`.")
@after_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def submit(spec, profile_path, template_dir, sets, dry_run, wait, timeout, hold, after, as_json):
    """Submit SPEC to Slurm with sbatch and print the job id.

    Every submit is recorded in .hpcsuite/runs.jsonl in this directory (`hpcsuite runs`); the
    run directory keeps the rendered script, the resolved job and site profile. With --wait,
    follow the job (on a terminal one line of state, step, throughput and loss, rewritten in
    place) and exit with its outcome: 0 completed, 1 failed, 2 failed on an error in its input
    (that error first), 3 stopped early or before its time limit after a checkpoint (submit
    again to resume). Refused before sbatch: a checkpoint directory another live job writes,
    or one whose checkpoint already finished this run."""
    from .. import runner

    if hold and wait:
        raise click.UsageError("--hold and --wait: a held job would be waited for forever")
    request = prepare_request(spec, profile_path, template_dir, sets, against_slurm=not dry_run,
                              after=after)
    if hold:
        request = runner.held(request)
    if dry_run:
        if as_json:
            emit_json(request.to_json())
        else:
            click.echo(request.script, nl=False)
            click.echo("# " + " ".join([*request.sbatch_argv, "<script>"]))
        return
    done = runner.submit(request)
    if not wait:
        if as_json:
            emit_json({"job_id": done.job_id, "run_dir": done.run_dir})
        else:
            click.echo(done.job_id)
        return
    if not as_json:
        click.echo(f"submitted job {done.job_id}; run directory {done.run_dir}")
    finish(follow(done.job_id, done.run_dir, timeout, as_json), as_json)


def finish(outcome, as_json: bool) -> None:
    """A followed job's end, said: its summary (or JSON), and its error raised (the exit
    status `submit --wait` and `status --wait` give)."""
    from .. import runner

    if as_json and outcome.state is not None and outcome.exit_class != runner.NEVER_STARTS:
        emit_json(outcome.to_json())
    if not as_json and outcome.exit_class in (runner.COMPLETED, runner.STOPPED):
        click.echo(outcome.summary())
    if outcome.error() is not None:
        for line in [] if as_json else outcome.tracking_lines():   # the MLflow run it leaves
            click.echo(line, err=True)
        raise outcome.error()


def follow(job_id: str, run_dir: str, timeout: float | None, as_json: bool):
    """:func:`hpcsuite.runner.wait`, its live line shown: on a terminal one line rewritten in
    place, else a line when the state changes or every 30 s."""
    from ..runner import wait

    t0 = time.monotonic()
    stream = click.get_text_stream("stderr")
    live = not as_json and stream.isatty()
    shown = {"line": None, "at": float("-inf"), "state": None}

    def show(record) -> None:
        line = record.line()
        if as_json or line == shown["line"]:
            return
        if live:            # one line, rewritten in place
            click.echo("\r\033[K" + f"job {job_id}: {line}"[:stream_width()], nl=False, err=True)
        elif record.state.state != shown["state"] or time.monotonic() - shown["at"] >= 30:
            click.echo(f"[{time.monotonic() - t0:6.1f}s] job {job_id}: {line}", err=True)
            shown["at"] = time.monotonic()
        else:
            return
        shown.update(line=line, state=record.state.state)

    try:
        return wait(job_id, run_dir, timeout, on_progress=show)
    finally:
        if live and shown["line"] is not None:
            click.echo("", err=True)


def stream_width() -> int:
    import shutil

    return max(20, shutil.get_terminal_size((100, 20)).columns - 1)
