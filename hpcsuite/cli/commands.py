"""Job commands: render, submit, status, logs, cancel, train."""

from __future__ import annotations

import time
from pathlib import Path

import click

from . import (FilePath, after_option, emit_json, main, prepare_request, profile_option,
               set_option, template_dir_option)
from ..errors import UserError
from ..runs.rundir import RunDir

spec_argument = click.argument("spec", type=FilePath(dir_okay=False))


@main.command()
@spec_argument
@profile_option
@template_dir_option
@set_option
@after_option
@click.option("--json", "as_json", is_flag=True, help="Print script and sbatch command as JSON.")
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
    outcome = follow(done.job_id, done.run_dir, timeout, as_json)
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


def _find_run(run: str) -> tuple[str, dict | None]:
    from ..runs import registry

    return registry.locate(Path.cwd(), run)


def _run_dir_of(entry: dict | None) -> Path | None:
    return Path(entry["run_dir"]) if entry and entry.get("run_dir") else None


@main.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(run, as_json):
    """Show the state of RUN: a job id, a run directory, or a job name (its latest run).

    State, elapsed time, exit code, requeues and MaxRSS (from Slurm accounting, sacct, where
    the cluster keeps it; else from the controller or its job completion log), and from the run
    directory the latest step, epoch, throughput and loss (while it runs) or the results (when
    it has finished), what stopped it, and its attempts (a requeued job: how many were
    preempted or stopped at the time limit, how many failed, how the last one ended)."""
    from ..runner import describe

    record = describe(run)
    if as_json:
        emit_json(record.to_json())
    else:
        click.echo("\n".join(record.lines()))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-n", "--last", type=int, default=20, show_default=True,
              help="Only the last N runs (0: all).")
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
def logs(run, lines, follow, rank):
    """Print the output of RUN (a job id, a run directory, or a job name)."""
    from .. import runner

    job_id, entry = _find_run(run)
    state = runner.state(job_id)
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
def cancel(run):
    """Cancel RUN (a job id, a run directory, or a job name: its latest run); for a job
    array, every element that still waits or runs. Exit 2 when there is nothing to cancel:
    the job has ended, was cancelled already, or Slurm does not know it."""
    from ..runner import cancel

    job_id, _ = _find_run(run)
    click.echo(cancel(job_id))


@main.command()
@click.argument("spec", required=False, type=FilePath(dir_okay=False))
@profile_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--no-compute", is_flag=True,
              help="Skip the compute-node probe (an srun that imports the frameworks there).")
def doctor(spec, profile_path, as_json, no_compute):
    """Check the cluster against the site profile before a job finds out.

    \b
    slurm       the controller answers; the profile's partitions exist and are up
    slurm-rules Slurm's version (sbatch and controller) and what changed since 22.05 on
                the profile's scripts (or SPEC's): options removed or now refused
    accounting  sacct answers (slurmdbd): finished jobs stay findable (warns without)
    pmi         srun --mpi=list has the profile's mpi.srun_mpi
    mpi         the flavour's launcher (mpirun or mpiexec): MPI family and version
    horovod     Horovod's build as horovodrun --check-build marks it (asked of
                horovod.torch and horovod.tensorflow, seconds instead of check-build's
                ~35 s): frameworks, MPI controller, NCCL where the profile has GPU partitions
    horovod-mpi the libmpi that Horovod's library resolves to (ldd) and what it says it is,
                against the launcher on PATH: a Horovod built against another MPI fails
    infiniband  devices, against the profile's pml
    network     interfaces named by NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES
                or the profile's btl/oob_tcp_if_include exist
    gpus        NVIDIA GPUs (NVML, else nvidia-smi); through NVML their health, as a
                job's preflight.gpu judges it: ECC, pending retirement/remapping,
                slowed clocks, other processes
    fabric      the profile's fabric and the busbw preflight.fabric (site) asks, or
                why site cannot be used (the profile names no fabric)
    compute     one srun on a compute node: Python, numpy, torch, TensorFlow, Horovod,
                and its GPUs' health

    The slow checks (horovod, horovod-mpi, compute) run side by side; stderr says what
    doctor waits for and when each is done. With SPEC, its launcher, partition and env
    are checked too. Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad
    input."""
    from ..submit.config import resolve
    from ..site.doctor import FAIL, report, run_checks
    from ..runner.against_slurm import profile_scripts

    # Without a spec only the profile matters; the job layer needs a name to resolve.
    r = resolve(spec, profile_path, () if spec else ("name=doctor",))
    job = r.job if spec else None
    checks = run_checks(r.profile, launcher=job.launcher if job else None,
                        partition=job.resources.partition if job else None,
                        env=dict(job.env) if job else None, compute=not no_compute,
                        progress=lambda text: click.echo(f"doctor: {text}", err=True),
                        scripts=profile_scripts(r, whole_profile=not spec))
    if as_json:
        emit_json([c.to_json() for c in checks])
    else:
        click.echo(report(checks))
    if any(c.status == FAIL for c in checks):
        raise click.exceptions.Exit(1)


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
    from ..runs import attempts

    code = attempts.begin(Path(run_dir), _attempt_job(run_dir),
                          out=lambda line: click.echo(line, err=False))
    raise click.exceptions.Exit(code)


@attempt.command("end")
@click.option("--run-dir", required=True, type=FilePath(file_okay=False))
@click.option("--status", type=int, required=True, help="The launcher's exit status.")
def attempt_end(run_dir, status):
    """After the ranks ended: record the outcome, requeue when the spec allows it. Exits with
    the launcher's status."""
    import signal

    from ..runs import attempts
    from ..runs.mlflow_store import end_attempt as end_tracking

    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2"):   # the time limit's TERM must not cut the record
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    job = _attempt_job(run_dir)
    code = attempts.end(Path(run_dir), job, status, out=lambda line: click.echo(line))
    # An MLflow run rank 0 left open ends as the attempt did (after a requeue too: the next
    # attempt continues the run, so a close cut short by the requeue loses nothing).
    end_tracking(job, Path(run_dir), out=lambda line: click.echo(line))
    raise click.exceptions.Exit(code)
