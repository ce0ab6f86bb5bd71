"""Job commands: render, submit, status, logs, cancel, train."""

from __future__ import annotations

import time
from pathlib import Path

import click

from . import (FilePath, emit_json, main, note_no_site, profile_option, set_option,
               template_dir_option)
from ..errors import JobFailed, JobInputFailed, JobPreempted, UserError

spec_argument = click.argument("spec", type=FilePath(dir_okay=False))


def _plan(spec: str, profile_path: str | None, template_dir: str | None, sets=(),
          against_slurm: bool = False):
    """Resolve, lint (against Slurm's partitions too when submitting) and plan SPEC."""
    from ..config import resolve
    from ..plan import plan
    from ..templating import SearchPath

    from ..lint import enforce, lint, slurm_findings

    r = resolve(spec, profile_path, sets)
    findings = lint(r.job, r.profile)
    if against_slurm and not any(f.level == "error" for f in findings):
        findings += slurm_findings(r.job)
    for warning in enforce(findings, spec):
        click.echo(f"warning: {spec}: {warning.key}: {warning.message}", err=True)
    import dataclasses

    site_only = "template" in r.locks
    request = plan(r.job, r.profile, SearchPath.default(template_dir, site_only=site_only), r.locks)
    note_no_site(r, spec)          # once, and only beside a success: an error stays one line
    return dataclasses.replace(request, spec=str(Path(spec).resolve()))


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
@click.option("--wait", is_flag=True,
              help="Follow the job to its end; exit 1 if it failed, 2 if it failed on an input "
                   "error, 3 if it stopped after saving a checkpoint.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@click.option("--hold", is_flag=True,
              help="Submit the job held: it starts after `scontrol release JOBID`.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def submit(spec, profile_path, template_dir, sets, dry_run, wait, timeout, hold, as_json):
    """Submit SPEC to Slurm with sbatch and print the job id.

    Every submit is recorded in .hpcsuite/runs.jsonl in this directory (`hpcsuite runs`); the
    run directory keeps the rendered script, the resolved job and site profile. With --wait,
    follow the job (on a terminal one line of state, step, throughput and loss, rewritten in
    place) and exit with its outcome: 0 completed, 1 failed, 2 failed on an error in its input
    (that error first), 3 stopped early or before its time limit after a checkpoint (submit
    again to resume). Refused before sbatch: a checkpoint directory another live job writes,
    or one whose checkpoint already finished this run."""
    import dataclasses

    from ..plan import submit as do_submit

    if hold and wait:
        raise click.UsageError("--hold and --wait: a held job would be waited for forever")
    request = _plan(spec, profile_path, template_dir, sets, against_slurm=not dry_run)
    if hold:
        request = dataclasses.replace(request, sbatch_argv=[*request.sbatch_argv, "--hold"])
    if dry_run:
        if as_json:
            emit_json(request.to_json())
        else:
            click.echo(request.script, nl=False)
            click.echo("# " + " ".join([*request.sbatch_argv, "<script>"]))
        return
    from ..attempts import check_before_submit

    check_before_submit(request.job, request.workdir)
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


def progress_line(state, progress: dict | None) -> str:
    """One line: state, elapsed (why it waits, when pending), and the job's latest step,
    epoch, throughput and loss."""
    from ..jobs import explain_pending

    parts = [state.state]
    if state.elapsed:
        parts.append(state.elapsed)
    why = explain_pending(state)
    if why:
        parts.append(f"({why[0]})")
    if progress:
        step, total = progress.get("step"), progress.get("max_steps")
        parts.append(f"step {step}" + (f"/{total}" if total else ""))
        if progress.get("epoch") is not None:
            parts.append(f"epoch {progress['epoch']}")
        if progress.get("samples_per_s"):
            parts.append(f"{progress['samples_per_s']:.0f} samples/s")
        if progress.get("loss") is not None:
            parts.append(f"loss {progress['loss']:.4f}")
        if progress.get("attempt"):
            parts.append(f"attempt {progress['attempt']}")
    return " ".join(str(p) for p in parts)


def _wait_and_report(job_id: str, run_dir: str, timeout: float | None, as_json: bool) -> None:
    from .. import jobs
    from ..results import RESULTS, Results, read_progress, summarize

    t0 = time.monotonic()
    stream = click.get_text_stream("stderr")
    live = not as_json and stream.isatty()
    shown = {"line": None, "at": float("-inf"), "state": None}

    def show(state) -> None:
        line = progress_line(state, read_progress(run_dir))
        if line == shown["line"]:
            return
        if live:            # one line, rewritten in place
            click.echo("\r\033[K" + f"job {job_id}: {line}"[:stream_width()], nl=False, err=True)
        elif state.state != shown["state"] or time.monotonic() - shown["at"] >= 30:
            click.echo(f"[{time.monotonic() - t0:6.1f}s] job {job_id}: {line}", err=True)
            shown["at"] = time.monotonic()
        else:
            return
        shown.update(line=line, state=state.state)

    current = {"state": None}

    def changed(state) -> None:
        current["state"] = state
        if not as_json:
            show(state)

    def tick() -> None:
        if not as_json and current["state"] is not None:
            show(current["state"])

    try:
        state = jobs.wait(job_id, timeout=timeout, on_change=changed, run_dir=run_dir, on_tick=tick)
    finally:
        if live and shown["line"] is not None:
            click.echo("", err=True)
    path = Path(run_dir) / RESULTS
    results = Results.load(path) if path.is_file() else None
    if as_json:
        payload = {"job_id": job_id, "state": state.state, "run_dir": run_dir}
        if results is not None:
            payload["results"] = results.to_json()
        emit_json(payload)
    if not state.ok:
        log = jobs.log_path(state) or Path(run_dir).parent / f"slurm-{job_id}.out"
        tail = jobs.tail(log)
        if (state.exit_code or "").startswith("2:"):
            # The job ended on an error hpcsuite reported (bad input, a damaged file): that
            # one line first, and exit 2 as for any input error.
            reported = [l for l in tail.splitlines() if l.startswith("error: ")]
            raise JobInputFailed(f"job {job_id} ended {state.state}: "
                                 f"{reported[0][7:] if reported else 'exit 2'}\n"
                                 f"last lines of {log}:\n{tail}")
        raise JobFailed(f"job {job_id} ended {state.state} (exit {state.exit_code}); "
                        f"last lines of {log}:\n{tail}")
    if not as_json:
        click.echo(summarize(run_dir) if results is not None else
                   f"job {job_id} completed; no results.json in {run_dir}")
    if results is not None and results.status in ("preempted", "time_limit"):
        why = "before its time limit" if results.status == "time_limit" else "early"
        raise JobPreempted(f"job {job_id} stopped {why} after saving a checkpoint at step "
                           f"{results.final_step}; submit the same spec again to resume")


def stream_width() -> int:
    import shutil

    return max(20, shutil.get_terminal_size((100, 20)).columns - 1)


def _find_run(run: str) -> tuple[str, dict | None]:
    from .. import registry

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
    from .. import attempts, jobs
    from ..results import RESULTS, Results, read_progress

    from .. import registry

    job_id, entry = _find_run(run)
    state = jobs.query(job_id)
    if entry is None and state.workdir:     # a job id from elsewhere: where it was submitted
        try:
            entry = registry.find(state.workdir, job_id)
        except (UserError, OSError):
            entry = None                    # not ours to read: Slurm's view alone
    run_dir = _run_dir_of(entry)
    progress = read_progress(run_dir) if run_dir else None
    results = None
    if run_dir and (run_dir / RESULTS).is_file():
        results = Results.load(run_dir / RESULTS)
    records = attempts.read_records(run_dir) if run_dir else []
    job_spec = _job_of(run_dir) if run_dir and (run_dir / "job.json").is_file() else None
    if as_json:
        payload = {**state.to_json(), "run_dir": str(run_dir) if run_dir else None,
                   "progress": progress, "name": (entry or {}).get("name")}
        if results is not None:
            payload["results"] = {"status": results.status, "final_step": results.final_step,
                                  "samples_per_s": results.samples_per_s,
                                  "attempt": results.attempt, "stop": results.stop,
                                  "attempts": results.attempts, "history": results.history}
        c = attempts.counts(records)
        payload["attempts"] = {"records": records, "count": c.attempts, "completed": c.completed,
                               "preempted": c.preempted, "failed": c.failed}
        emit_json(payload)
        return
    name = f" ({entry['name']})" if entry and entry.get("name") else ""
    click.echo(f"job {state.job_id}{name}: {progress_line(state, progress)}")
    details = [f"exit {state.exit_code}" if state.exit_code else None,
               f"requeued {state.restarts} time(s)" if state.restarts else None,
               f"MaxRSS {state.max_rss}" if state.max_rss else None,
               f"from {state.source}"]
    click.echo("  " + ", ".join(d for d in details if d))
    if results is not None:
        click.echo(f"  results: {results.status} at step {results.final_step}, "
                   f"{results.samples_per_s:.1f} samples/s, attempt {results.attempt}")
        if results.stop:
            from ..results import describe_stop
            click.echo(f"  stopped: {describe_stop(results)}")
        if len(results.attempts or []) > 1:
            from ..results import describe_run
            click.echo(f"  whole run: {describe_run(results)}")
    if records:
        click.echo(f"  attempts: {attempts.counts(records).describe()}; last: "
                   f"{_describe_record(records[-1])}")
    if state.state == "TIMEOUT" and job_spec is not None:
        click.echo(f"  reached its time limit without stopping first; {_last_checkpoint(job_spec, run_dir)}")
    if run_dir:
        click.echo(f"  run directory: {run_dir}")


def _job_of(run_dir: Path):
    from ..runtime.train import load_job

    return load_job(str(run_dir / "job.json"))


def _describe_record(r: dict) -> str:
    text = f"attempt {r['attempt']} {r['outcome']}"
    if r.get("step") is not None:
        text += f" at step {r['step']}"
    if r.get("exit"):
        text += f" (exit {r['exit']})"
    if r.get("why"):
        text += f" ({r['why']})"
    if r.get("requeued"):
        text += ", requeued"
    return text


def _last_checkpoint(job, run_dir: Path) -> str:
    from ..attempts import checkpoint_root, newest_checkpoint

    if not job.train.checkpoint.enabled:
        return "checkpoints are off: its work is lost"
    newest = newest_checkpoint(checkpoint_root(job, run_dir))
    if newest is None:
        return "no checkpoint was saved"
    return f"the last checkpoint is step {newest[1].get('step')} ({newest[0]}); submit again to resume"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-n", "--last", type=int, default=20, show_default=True,
              help="Only the last N runs (0: all).")
def runs(as_json, last):
    """List the runs submitted from this directory, newest last, with their state.

    The registry is .hpcsuite/runs.jsonl here; states, exit codes and MaxRSS come from one
    sacct call for all the runs where the cluster keeps accounting, else from one squeue call
    (and Slurm's job completion records for the jobs the controller has forgotten)."""
    from .. import jobs, registry
    from ..results import read_progress

    entries = registry.load(Path.cwd())
    if last:
        entries = entries[-last:]
    states = jobs.query_many([e["job_id"] for e in entries]) if entries else {}
    rows = []
    for e in entries:
        state = states.get(e["job_id"])
        progress = read_progress(e["run_dir"])
        rows.append({"job_id": e["job_id"], "name": e.get("name"),
                     "state": state.state if state else "UNKNOWN",
                     "elapsed": state.elapsed if state else None,
                     "exit_code": state.exit_code if state else None,
                     "max_rss": state.max_rss if state else None,
                     "restarts": state.restarts if state else None,
                     "source": state.source if state else None,
                     "step": (progress or {}).get("step"), "submitted_at": e.get("submitted_at"),
                     "run_dir": e["run_dir"], "spec": e.get("spec"), "git": e.get("git")})
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no runs submitted from {Path.cwd()}")
        return
    click.echo(f"{'JOB':>8}  {'NAME':<20} {'STATE':<11} {'ELAPSED':>10} {'EXIT':>5} "
               f"{'MAXRSS':>7} {'STEP':>7}  {'SUBMITTED':<19}  RUN DIR")
    for r in rows:
        click.echo(f"{r['job_id']:>8}  {(r['name'] or '')[:20]:<20} {r['state']:<11} "
                   f"{r['elapsed'] or '-':>10} {r['exit_code'] or '-':>5} {r['max_rss'] or '-':>7} "
                   f"{r['step'] if r['step'] is not None else '-':>7}  "
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
    from .. import jobs

    job_id, entry = _find_run(run)
    state = jobs.query(job_id)
    run_dir = _run_dir_of(entry)
    if rank is not None:
        if run_dir is None:
            raise UserError(f"job {job_id}: no run directory known for --rank (not submitted from "
                            "here); give its run directory")
        path = run_dir / "logs" / f"rank-{rank}.log"
    else:
        path = jobs.log_path(state)
        if path is None and run_dir is not None:
            path = run_dir.parent / f"slurm-{job_id}.out"
    if not follow and (path is None or not path.is_file()):
        raise UserError(f"job {job_id} has no output file yet ({path or 'unknown path'})")
    offset = 0
    if path is not None and path.is_file():
        text = path.read_text(errors="replace")
        offset = len(text.encode())
        if lines is not None:
            text = "\n".join(text.splitlines()[-lines:]) + ("\n" if text else "")
        click.echo(text, nl=False)
    if follow:
        _follow(job_id, path, offset, run_dir)


def _follow(job_id: str, path: Path | None, offset: int, run_dir: Path | None) -> None:
    """Print what is appended to ``path`` until the job has ended and the file is drained."""
    from .. import jobs

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
        jobs.wait(job_id, run_dir=str(run_dir) if run_dir else None, on_tick=drain)
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
    timeline window (train.monitor.timeline_steps), the time per step of its activities."""
    from ..run_report import plot, timeline_line, timeline_summary, timeline_windows

    job_id, entry = _find_run(run)
    if entry is None:
        raise UserError(f"job {job_id}: no run directory known (not submitted from here); give "
                        "its run directory")
    for path in plot(Path(entry["run_dir"]), Path(out) if out else None):
        click.echo(str(path))
    for window in timeline_windows(Path(entry["run_dir"])):
        click.echo(f"{window}\n  {timeline_line(timeline_summary(window))}")


@main.command()
@click.argument("run")
def cancel(run):
    """Cancel RUN (a job id, a run directory, or a job name: its latest run)."""
    from .. import jobs

    job_id, _ = _find_run(run)
    jobs.cancel(job_id)
    click.echo(f"cancelled {job_id}")


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
    accounting  sacct answers (slurmdbd): finished jobs stay findable (warns without)
    pmi         srun --mpi=list has the profile's mpi.srun_mpi
    mpi         mpirun is OpenMPI (its version)
    horovod     horovodrun --check-build: frameworks, MPI controller, NCCL where the
                profile has GPU partitions
    infiniband  devices, against the profile's pml
    network     interfaces named by NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES
                or the profile's btl/oob_tcp_if_include exist
    gpus        NVIDIA GPUs (NVML, else nvidia-smi)
    compute     one srun on a compute node: Python, numpy, torch, TensorFlow, Horovod

    With SPEC, its launcher, partition and env are checked too. Exit 0 when nothing
    failed (warnings allowed), 1 when a check failed, 2 on bad input."""
    from ..config import resolve
    from ..doctor import FAIL, report, run_checks

    # Without a spec only the profile matters; the job layer needs a name to resolve.
    r = resolve(spec, profile_path, () if spec else ("name=doctor",))
    job = r.job if spec else None
    checks = run_checks(r.profile, launcher=job.launcher if job else None,
                        partition=job.resources.partition if job else None,
                        env=dict(job.env) if job else None, compute=not no_compute)
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


@main.group(hidden=True)
def attempt():
    """In-job bookkeeping the batch script calls around each attempt (hpcsuite.attempts)."""


def _attempt_job(run_dir: str):
    from ..runtime.train import load_job

    return load_job(str(Path(run_dir) / "job.json"))


@attempt.command("begin")
@click.option("--run-dir", required=True, type=FilePath(file_okay=False))
def attempt_begin(run_dir):
    """Before the ranks start: earlier attempts' records, the failure budget, the checkpoint
    directory's owner. Exits non-zero when the attempt must not run."""
    from .. import attempts

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

    from .. import attempts

    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2"):   # the time limit's TERM must not cut the record
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    code = attempts.end(Path(run_dir), _attempt_job(run_dir), status,
                        out=lambda line: click.echo(line))
    raise click.exceptions.Exit(code)
