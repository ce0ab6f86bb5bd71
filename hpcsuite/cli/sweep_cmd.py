"""Sweeps as Slurm job arrays: sweep run, status, report, resubmit."""

from __future__ import annotations

import time

import click

from . import (FilePath, emit_json, main, note_no_site, profile_option, remote_option,
               template_dir_option)


@main.group()
def sweep():
    """Sweeps: one job over values of any job key, submitted as ONE Slurm job array.

    \b
    A sweep file (YAML) names a base job spec and the keys to vary:
      name: lr-seed
      base: job.yaml                    # relative to the sweep file
      axes:                             # any key --set takes: the grid of all values
        train.lr: [0.01, 0.05, 0.1]
        train.seed: [1, 2]
      # random: {count: 8, seed: 0}     # draw 8 elements instead; an axis may then be
      #   {log_uniform: [0.001, 0.1]}, {uniform: [lo, hi]}, {randint: [lo, hi]}, {choice: [...]}
      max_parallel: 2                   # at once (--array=0-5%2; the site's
                                        # sweep_max_parallel is the default and the ceiling)
      metric: {name: val_accuracy, goal: max}   # or val_loss, loss, samples_per_s, metrics.KEY
    Every element is its base spec with one --set per axis: the site's locks, lint and the
    #SBATCH header read-back apply to each before anything is submitted. A job array runs one
    script, so axes may vary what the ranks read (train.*, env is not: it is in the script);
    each element gets its own job.json and run directory, OUTPUT_DIR/NAME/ARRAYID_INDEX.

    \b
      hpcsuite sweep run SWEEP.yaml [--dry-run] [--wait]
      hpcsuite sweep status sweeps/NAME           # one line per element, from one Slurm query
      hpcsuite sweep report sweeps/NAME           # table; report/sweep.csv, sweep.json, sweep.png
      hpcsuite sweep resubmit sweeps/NAME --element 3   # one failed element again, alone
      hpcsuite status ARRAYID_INDEX               # one element; `hpcsuite runs` lists them all
    """


def _say(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


@sweep.command("run")
@click.argument("sweep_file", type=FilePath(exists=True, dir_okay=False))
@click.option("--dir", "directory", type=FilePath(file_okay=False),
              help="The sweep directory (default: OUTPUT_DIR/NAME beside the sweep file).")
@profile_option
@template_dir_option
@click.option("--dry-run", is_flag=True, help="Check every element and print them and the "
              "array's script; write and submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the elements until every one has ended; "
              "exit 1 if any failed.")
@click.option("--timeout", type=float, default=None, help="With --wait: stop following after "
              "SECONDS (the jobs go on).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def run_cmd(sweep_file, directory, profile_path, template_dir, dry_run, wait, timeout, as_json):
    """Check every element of SWEEP_FILE, write the sweep directory and submit one job array.

    Each element (the base spec with its axis values as --set) is resolved through the site's
    layers and locks, linted and rendered first; one bad element refuses the whole sweep with
    one line naming the element and the key, and nothing is submitted. Run from the directory
    the base spec's relative paths mean (as for `hpcsuite submit`); the array is recorded in
    .hpcsuite/runs.jsonl here."""
    from ..submit.schema import to_dict
    from ..sweep.run import plan_sweep, run

    planned = plan_sweep(sweep_file, directory, profile_path, template_dir,
                         against_slurm=not dry_run)
    for line in planned.warnings:
        click.echo(f"warning: {line}", err=True)
    note_no_site(planned.site_profile, sweep_file)
    if dry_run:
        if as_json:
            emit_json({"sweep_dir": str(planned.sd.path), "array": planned.array.spec,
                       "elements": [to_dict(e) for e in planned.elements],
                       "script": planned.request.script})
            return
        for e in planned.elements:
            click.echo(f"# element {e.index}: {' '.join('--set ' + s for s in e.sets)}")
        click.echo(planned.request.script, nl=False)
        click.echo(f"# {' '.join([*planned.request.sbatch_argv, '<script>'])}   "
                   f"(sweep directory {planned.sd.path})")
        return
    sd, job_id = run(planned)
    n = len(planned.elements)
    if not wait:
        if as_json:
            emit_json({"job_id": job_id, "sweep_dir": str(sd.path), "elements": n})
        else:
            click.echo(job_id)
        _say(f"sweep {planned.sweep.name}: job array {job_id} ({n} elements, "
             f"--array={planned.array.spec}); sweep directory {sd.path}")
        return
    _say(f"sweep {planned.sweep.name}: job array {job_id} ({n} elements); {sd.path}")
    _finish(sd, timeout, as_json, {"job_id": job_id})


def _finish(sd, timeout, as_json, payload: dict) -> None:
    from ..errors import JobFailed
    from ..sweep.status import wait as follow

    rows, tally = follow(sd, timeout, _say)
    if as_json:
        emit_json({**payload, "sweep_dir": str(sd.path), "elements": list(rows.values())})
    failed = [str(i) for i, r in rows.items() if r["finished"] and not r["done"]]
    if failed:
        raise JobFailed(f"sweep {sd.path.name}: element(s) {', '.join(failed)} did not complete "
                        f"(`hpcsuite sweep status {sd.path}`); `hpcsuite sweep resubmit "
                        f"{sd.path} --element I` runs one again")
    if not as_json:
        click.echo(f"sweep {sd.path.name}: {tally.line()}; `hpcsuite sweep report {sd.path}`")


@sweep.command("status")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def status_cmd(target, as_json):
    """Where each element of a sweep is (TARGET: sweep directory or sweep file): its newest
    job (ARRAYID_INDEX), Slurm's state of it (one query for every element), its latest step,
    and whether its run completed."""
    from ..sweep.status import element_rows, tally
    from ..sweep.sweepdir import open_sweep

    sd = open_sweep(target)
    rows, note = element_rows(sd)
    if note:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(list(rows.values()))
        return
    click.echo(f"{'#':>3} {'job':>11} {'state':<13} {'step':>6} {'tries':>5}  values")
    for r in rows.values():
        state = "done" if r["done"] else r["state"]
        values = ", ".join(f"{k}={v}" for k, v in r["values"].items())
        step = r["step"] if r["step"] is not None else "-"
        click.echo(f"{r['index']:>3} {r['job_id'] or '-':>11} {state:<13} {step:>6} "
                   f"{r['submitted']:>5}  {values}")
    click.echo(tally(rows).line())


@sweep.command("report")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@remote_option
def report_cmd(target, as_json):
    """One table of every element (TARGET: sweep directory or sweep file): final training
    loss, best validation accuracy and loss, samples/s, and the sweep's metric, the best
    element marked with *. Writes report/sweep.csv, report/sweep.json and report/sweep.png
    (the metric against the first numeric axis) in the sweep directory."""
    from ..sweep.report import report, table, write
    from ..sweep.sweepdir import open_sweep

    sd = open_sweep(target)
    data = report(sd)
    written = write(sd, data)
    for note in data["notes"]:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(data)
        return
    click.echo("\n".join(table(data)))
    click.echo(f"wrote {', '.join(str(p) for p in written)}")


@sweep.command("resubmit")
@click.argument("target", type=FilePath(exists=True))
@click.option("--element", "index", type=click.IntRange(0, 10**6), required=True,
              help="The element's index (`hpcsuite sweep status` lists them).")
@profile_option
@template_dir_option
@click.option("--wait", is_flag=True, help="Follow it to its end.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@remote_option
def resubmit_cmd(target, index, profile_path, template_dir, wait, timeout, as_json):
    """Submit one element of a sweep again, alone: a one-element job array (--array=INDEX)
    with the job.json it had, checked again against the site first. Refused while the element
    is queued or running, once it completed, or when its job now resolves differently (the
    base spec or a profile changed). Its new run directory is OUTPUT_DIR/NAME/NEWID_INDEX;
    the sweep's status and report follow the newest. It keeps the sweep's max_parallel: while
    that many of the sweep's elements wait or run, it waits for them (a Slurm dependency on
    all but the newest max_parallel - 1)."""
    from ..runs.rundir import element_id
    from ..sweep.run import resubmit
    from ..sweep.sweepdir import open_sweep

    sd = open_sweep(target)
    done = resubmit(sd, index, profile_path, template_dir)
    element = element_id(done.job_id, index)
    if done.waits_for:
        _say(f"element {index} waits for {', '.join(done.waits_for)} to end (max_parallel "
             f"{done.max_parallel})")
    if not wait:
        if as_json:
            emit_json({"job_id": element, "sweep_dir": str(sd.path),
                       "waits_for": done.waits_for})
        else:
            click.echo(element)
        return
    _say(f"element {index} of sweep {sd.path.name} submitted again as {element}")
    _finish(sd, timeout, as_json, {"job_id": element})
