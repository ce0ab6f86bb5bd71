"""Scaling studies: study run, status, report, rerun, compare."""

from __future__ import annotations

import time
from pathlib import Path

import click

from . import FilePath, emit_json, main, profile_option


@main.group()
def study():
    """Scaling studies: sweep a job over nodes, ranks, batch and Horovod knobs, then explain.

    \b
    A study spec (YAML) names a base job spec and the axes to sweep:
      name: weak-mlp
      base: job.yaml            # relative to the study file
      mode: weak                # weak: batch_size per rank; strong: the global batch
      axes: {nodes: [1, 2], horovod.fusion_threshold_mb: [0, 64]}
      repeats: 2                # jobs per point: the spread of the results
      warmup_steps: 10          # left out of the timing
      steps: 50                 # measured steps per job
    Each configuration also runs without the gradient allreduce (the no-communication
    limit), and each multi-rank allocation runs an allreduce benchmark, so the report can
    say how close each point comes to what the hardware allows, and why.

    \b
      hpcsuite study run STUDY.yaml --wait     # bundle, submit every point, follow them
      hpcsuite study report studies/NAME      # table, CSV, JSON, PNG plots
      hpcsuite study rerun studies/NAME       # the same study again, from the bundle alone
      hpcsuite study compare A B              # inputs and results side by side
    """


def _say(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


@study.command("run")
@click.argument("target", type=FilePath(exists=True))
@click.option("--dir", "directory", type=FilePath(file_okay=False),
              help="The study directory (default: OUTPUT_DIR/NAME beside the study file).")
@profile_option
@click.option("--wait", is_flag=True, help="Follow the points until every one has ended, "
              "submitting more as jobs finish (max_in_flight at a time).")
@click.option("--timeout", type=float, default=None, help="With --wait: stop following after "
              "SECONDS (the jobs go on; run again to continue).")
@click.option("--dry-run", is_flag=True, help="Make the bundle and check every point against "
              "the site's rules; submit nothing (versions not cached for this installation "
              "are asked by the first real run).")
def run_cmd(target, directory, profile_path, wait, timeout, dry_run):
    """Render and submit every point of TARGET (a study spec, or a study directory to go on).

    The first run makes the study directory: a bundle of the study spec, the base spec's
    directory (spec, user code, data), each point's resolved job spec and rendered script,
    versions and sha256 of every input. Every point is checked against the site's limits
    before anything is submitted. Running it again keeps finished points and submits the
    missing or failed ones (up to 3 attempts each); Ctrl-C loses nothing.
    """
    from ..study.points import StudyDir, create
    from ..study.run import run

    if Path(target).is_dir():
        sd = StudyDir(Path(target))
        sd.points()
    else:
        sd = create(target, directory, profile_path, ask_tools=not dry_run)
    points = sd.points()
    _say(f"study {sd.path.name}: {len(points)} jobs in {sd.path}")
    if dry_run:
        for p in points:
            click.echo(f"{p.id}\t{p.kind}\t{', '.join(f'{k}={v}' for k, v in p.axes.items())}\t"
                       f"{sd.point_script(p)}")
        return
    try:
        done = run(sd, profile_path, wait, timeout, _say)
    except KeyboardInterrupt:
        click.echo(f"interrupted; jobs already submitted go on. `hpcsuite study run {sd.path}` "
                   "picks up where this left off", err=True)
        raise SystemExit(130) from None
    if wait and done.failed:
        from ..errors import JobFailed

        raise JobFailed(f"study {sd.path.name}: {done.failed} point(s) failed {3} times; "
                        f"`hpcsuite study status {sd.path}` lists them")
    if wait:
        click.echo(f"study {sd.path.name} complete; `hpcsuite study report {sd.path}`")
    else:
        click.echo(str(sd.path))


@study.command("status")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status_cmd(target, as_json):
    """Where each point of a study is (TARGET: study directory or study spec): the study's
    own status and Slurm's state of the point's job, asked now (state.json's, with a note,
    when Slurm cannot be asked)."""
    from ..study.points import open_study
    from ..study.status import status

    rows, note = status(open_study(target))
    if note:
        click.echo(f"note: {note}", err=True)
    if as_json:
        emit_json(rows)
        return
    click.echo(f"{'point':<10} {'kind':<9} {'job':>8} {'status':<14} {'slurm':<24} axes")
    for r in rows:
        axes = ", ".join(f"{k}={v}" for k, v in r["axes"].items())
        slurm = (r["slurm"] or "-") + (" (state.json)" if r["slurm_from"] == "state.json" else "")
        click.echo(f"{r['point']:<10} {r['kind']:<9} {r['job_id'] or '-':>8} {r['status']:<14} "
                   f"{slurm:<24} {axes}")


@study.command("report")
@click.argument("target", type=FilePath(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the table.")
def report_cmd(target, as_json):
    """Throughput, speedup and efficiency (median, min, max of the repeats) against the
    smallest point and the no-communication limit, the ring-allreduce model's reading of each
    point and the knob that would help most. A configuration whose repeats spread more than
    1.25x, or whose no-communication limit does not grow with the ranks, is FLAGGED instead of
    diagnosed. Versions a study failed to record are warnings. Writes report.{txt,csv,json}
    and throughput.png, efficiency.png into the study's report/ directory."""
    from ..study.points import open_study
    from ..study.report import table, write

    sd = open_study(target)
    report, paths = write(sd)
    if as_json:
        emit_json(report)
        return
    click.echo(table(report))
    click.echo("wrote " + ", ".join(str(p) for p in paths))


@study.command("rerun")
@click.argument("bundle", type=FilePath(exists=True, file_okay=False))
@click.option("--dir", "directory", type=FilePath(file_okay=False),
              help="The new study directory (default: BUNDLE-rerun-TIMESTAMP).")
@profile_option
@click.option("--wait", is_flag=True, help="Follow the points to their end.")
@click.option("--timeout", type=float, default=None, help="With --wait: stop following after SECONDS.")
def rerun_cmd(bundle, directory, profile_path, wait, timeout):
    """Run the study in BUNDLE again, from the bundle alone: its inputs (checked against their
    sha256), its resolved job specs, into a fresh study directory."""
    from ..study.points import rerun
    from ..study.run import run

    sd = rerun(Path(bundle), Path(directory) if directory else None)
    _say(f"re-running {Path(bundle).name} in {sd.path}")
    try:
        run(sd, profile_path, wait, timeout, _say)
    except KeyboardInterrupt:
        click.echo(f"interrupted; `hpcsuite study run {sd.path}` picks up where this left off",
                   err=True)
        raise SystemExit(130) from None
    click.echo(str(sd.path))


@study.command("compare")
@click.argument("a", type=FilePath(exists=True, file_okay=False))
@click.argument("b", type=FilePath(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def compare_cmd(a, b, as_json):
    """What differs between studies A and B: inputs (sha256), resolved job specs, versions, and
    each configuration's throughput, marked where it differs by more than the repeats' spread."""
    from ..study.points import open_study
    from ..study.compare import compare, compare_text

    c = compare(open_study(a), open_study(b))
    if as_json:
        emit_json(c)
    else:
        click.echo(compare_text(c))
