"""describe: one StatusRecord of a run, the one thing ``status`` (text and ``--json``),
``runs`` and ``submit --wait``'s live line print."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from ..errors import UserError
from ..records import Record, record
from ..runs.mlflow_store import summary, summary_line
from ..runs.rundir import RunDir


def progress_line(state, progress: dict | None) -> str:
    """One line: state, elapsed (why it waits, when pending), and the job's latest step,
    epoch, throughput and loss."""
    from ..runs.jobs import NEVER_RAN, explain_pending

    parts = [state.state]
    if state.elapsed:
        parts.append(state.elapsed)
    why = explain_pending(state)
    if why:
        parts.append(f"({why[0]})")
    if state.state == NEVER_RAN:
        parts.append(f"({state.reason})")
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
        slow = progress.get("slow_rank")
        if isinstance(slow, dict) and slow.get("rank") is not None:
            where = f" on {slow['host']}" if slow.get("host") else ""
            parts.append(f"| slow: rank {slow['rank']}{where} ({slow.get('ratio', 0):.1f}x)")
    return " ".join(str(p) for p in parts)


def slow_rank_lines(progress: dict | None, results) -> list[str]:
    """The rank the others wait for: while the job runs (progress.json) or as its attempt
    ended (results.json's rank_balance)."""
    from ..runs.stragglers import line

    live = (progress or {}).get("slow_rank") if results is None else \
        (results.rank_balance or {}).get("slow_rank")
    if not isinstance(live, dict) or live.get("rank") is None:
        return []
    return [f"slow rank: {line(live)}"]


def describe_record(r: dict) -> str:
    """One attempt record (attempts.jsonl) in words."""
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


@record
class StatusRecord(Record):
    """A run as Slurm and its run directory show it now."""

    job_id: str
    state: object = None               # JobState; None: Slurm was not asked or forgot it
    entry: dict | None = None          # the registry's entry (name, spec, git, submitted_at)
    run_dir: Path | None = None
    progress: dict | None = None       # progress.json: the latest step, loss, throughput
    results: object = None             # Results, once results.json is written
    records: list = field(default_factory=list)     # attempts.jsonl
    timeout_note: str | None = None    # a TIMEOUT: what was lost, what resumes
    error: dict | None = None          # the error its ranks reported (FAILED-attempt-N)
    errors: list = field(default_factory=list)      # every attempt's, oldest first
    script: list = field(default_factory=list)      # script mode: what each rank's script did

    @classmethod
    def live(cls, state, run_dir: str | Path | None) -> "StatusRecord":
        """State and progress only: what a job being followed shows every second."""
        return cls(job_id=state.job_id, state=state, run_dir=Path(run_dir) if run_dir else None,
                   progress=_listed_progress(run_dir) if run_dir else None)

    @classmethod
    def of_entry(cls, entry: dict, state=None) -> "StatusRecord":
        """A registry entry (its ``job_id`` and ``run_dir`` at least) with Slurm's state of
        it, None when Slurm was not asked or no longer knows it; the progress is read either
        way."""
        return cls(job_id=entry["job_id"], state=state, entry=entry,
                   run_dir=Path(entry["run_dir"]), progress=_listed_progress(entry["run_dir"]))

    @property
    def name(self) -> str | None:
        return (self.entry or {}).get("name")

    def line(self) -> str:
        return progress_line(self.state, self.progress)

    def to_json(self) -> dict:
        """`status --json`."""
        from ..runs import attempts, monitor_failures
        from ..runs.gpu_use import gpu_verdict

        payload = {**self.state.to_json(), "run_dir": str(self.run_dir) if self.run_dir else None,
                   "progress": self.progress, "name": self.name}
        r = self.results
        if r is not None:
            payload["results"] = {"status": r.status, "final_step": r.final_step,
                                  "samples_per_s": r.samples_per_s, "attempt": r.attempt,
                                  "stop": r.stop, "attempts": r.attempts, "history": r.history,
                                  "world_change": r.world_change,
                                  "energy_j": r.energy_j, "samples_per_joule": r.samples_per_joule,
                                  "slow_rank": (r.rank_balance or {}).get("slow_rank"),
                                  "gpu": gpu_verdict(r.utilisation, r.data_wait_fraction,
                                                     r.step_times_s, r.start_step)}
        c = attempts.counts(self.records)
        payload["error"] = self.error
        payload["errors"] = self.errors
        tracked = summary(self.run_dir) if self.run_dir else None
        if tracked:
            payload["tracking"] = tracked
        payload["script"] = self.script or None
        # train.monitor: the ranks that could not write their Prometheus textfile
        payload["monitor"] = monitor_failures.summary(self.run_dir)
        payload["attempts"] = {"records": self.records, "count": c.attempts,
                               "completed": c.completed, "preempted": c.preempted,
                               "failed": c.failed}
        return payload

    def lines(self) -> list[str]:
        """`status` as text."""
        from ..runs import attempts, monitor_failures
        from ..runs.gpu_use import gpu_lines
        from ..runs.results import describe_run, describe_stop

        s, r = self.state, self.results
        name = f" ({self.name})" if self.name else ""
        out = [f"job {s.job_id}{name}: {self.line()}"]
        details = [exit_words(s.exit_code, s.stdout) if s.exit_code else None,
                   f"requeued {s.restarts} time(s)" if s.restarts else None,
                   f"MaxRSS {s.max_rss}" if s.max_rss else None, f"from {s.source}"]
        out.append("  " + ", ".join(d for d in details if d))
        if r is not None:
            out.append(f"  results: {r.status} at step {r.final_step}, "
                       f"{r.samples_per_s:.1f} samples/s, attempt {r.attempt}")
            if r.world_change:
                from ..runs.world_change import in_words as world_change_in_words

                out.append(f"  {world_change_in_words(r.world_change)}")
            if r.stop:
                out.append(f"  stopped: {describe_stop(r)}")
            if len(r.attempts or []) > 1:
                out.append(f"  whole run: {describe_run(r)}")
            out += [f"  {line}" for line in gpu_lines(r)]
        out += [f"  {line}" for line in slow_rank_lines(self.progress, r)]
        if r is not None:
            from ..runs.comm_bound import line as comm_line

            bound = comm_line(r, self.run_dir)
            out += [f"  {bound}"] if bound else []
        out += [f"  {line}" for line in self.script_lines()]
        if self.records:
            out.append(f"  attempts: {attempts.counts(self.records).in_words()}; last: "
                       f"{describe_record(self.records[-1])}")
        for e in self.errors or ([self.error] if self.error else []):
            # A failure a later attempt ran on from (a requeue) is history, not the job's end.
            later = self.error is not e or (s.state == "COMPLETED") or any(
                r.get("attempt", -1) > e["attempt"] for r in self.records)
            head = f"attempt {e['attempt']} failed" if later else f"error (attempt {e['attempt']}"
            out.append(f"  {head}{' (' if later else ', '}{error_rank(e)}): {error_said(e)}")
        if self.timeout_note:
            out.append(f"  reached its time limit without stopping first; {self.timeout_note}")
        tracked = summary_line(self.run_dir) if self.run_dir else None
        if tracked:      # train.tracking: the MLflow run, a fall-back, a loss
            out.append(f"  {tracked}")
        unwritten = monitor_failures.summary_line(self.run_dir)
        if unwritten:    # train.monitor.prometheus_dir: a textfile a rank could not write
            out.append(f"  {unwritten}")
        if self.run_dir:
            out.append(f"  run directory: {self.run_dir}")
        return out

    def script_lines(self) -> list[str]:
        """Script mode: ranks that trained alone; a completed script that made no Run."""
        from ..runs.script_ranks import lines

        completed = self.state is not None and self.state.state == "COMPLETED"
        return lines(self.script, self.job_id, self.results is not None, completed)

    def row(self) -> dict:
        """One row of `runs` (and `runs --json`); a job array's row has ``array`` (its sweep,
        sweep directory and indices) and its elements' rows ``array_job_id`` and ``index``."""
        s, e = self.state, self.entry or {}
        extra = {k: e[k] for k in ("array", "array_job_id", "index") if k in e}
        return {"job_id": self.job_id, "name": e.get("name"), **extra,
                "state": s.state if s else ("ARRAY" if e.get("array") else "UNKNOWN"),
                "elapsed": s.elapsed if s else None, "exit_code": s.exit_code if s else None,
                "max_rss": s.max_rss if s else None, "restarts": s.restarts if s else None,
                "source": s.source if s else None, "step": (self.progress or {}).get("step"),
                "outcome": run_outcome(e["run_dir"]) if not e.get("array") else None,
                "submitted_at": e.get("submitted_at"), "run_dir": e["run_dir"],
                "spec": e.get("spec"), "git": e.get("git")}


def run_outcome(run_dir: str | Path) -> str | None:
    """The run's outcome over its attempts (:func:`hpcsuite.runs.outcome.outcome`) for a
    listing of many runs: damaged records are said, never an error that hides the others."""
    from ..runs.attempts import read_records
    from ..runs.outcome import outcome

    try:
        return outcome(read_records(run_dir))
    except UserError:
        return "attempt records damaged (`hpcsuite status` names the line)"


def reported_error(run_dir: Path | None) -> dict | None:
    """The failure the ranks reported in the latest attempt that reported one
    (``FAILED-attempt-N``, :func:`~hpcsuite.runs.rundir.failure_text`): {attempt, rank,
    message, node, at, hint, frames}. The message: the exception's type and message, else the
    ``error:`` line hpcsuite printed, else the last line; ``frames``: a traceback's last
    frames and its exception (None without one)."""
    errors = reported_errors(run_dir)
    return errors[-1] if errors else None


def reported_errors(run_dir: Path | None) -> list[dict]:
    """Every attempt's reported failure (:func:`reported_error`), oldest first."""
    import re

    if run_dir is None:
        return []
    found = []
    for path in RunDir(run_dir).failed_markers():
        m = re.search(r"-attempt-(\d+)$", path.name)
        if m:
            found.append((int(m.group(1)), path))
    return [e for e in (_marker_error(a, p) for a, p in sorted(found)) if e is not None]


def _marker_error(attempt: int, path: Path) -> dict | None:
    from ..runs.rundir import FAILURE_TAGS
    import re

    try:
        raw = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    rank = raw[0].partition(" ")[2] if raw and raw[0].startswith("rank ") else None
    body = raw[1:] if rank is not None else raw
    if body and re.fullmatch(r"exit \d+", body[0].strip()):
        body = body[1:]
    tags = {}
    for tag in FAILURE_TAGS:
        if body and body[0].startswith(f"{tag}: "):
            tags[tag] = body.pop(0)[len(tag) + 2:].strip()
    lines = [l.strip() for l in body if l.strip()]
    said = [l[len("error: "):] for l in lines if l.startswith("error: ")]
    message = tags.get("raised") or (said[0] if said else (lines[-1] if lines else "no message"))
    return {"attempt": attempt, "rank": int(rank) if rank and rank.isdigit() else rank,
            "message": message, "node": tags.get("node"), "at": tags.get("at"),
            "hint": tags.get("hint"), "frames": last_frames(body)}


def last_frames(lines: list[str], keep: int = 3) -> str | None:
    """The last ``keep`` frames of the traceback in ``lines`` and the exception after them
    (None without a traceback): what a user reads first, not the launcher's lines."""
    starts = [i for i, l in enumerate(lines) if l.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    tb = lines[starts[-1] + 1:]
    frames = [i for i, l in enumerate(tb) if l.startswith('  File "')]
    if not frames:
        return "\n".join(tb).strip() or None
    head = "Traceback (most recent call last):" if len(frames) <= keep else \
        f"Traceback (most recent call last, its last {keep} frames):"
    return "\n".join([head, *tb[frames[-keep:][0]:]]).rstrip()


def error_rank(e: dict) -> str:
    """Which rank reported it, and on which node: ``rank 1 on node2``."""
    who = f"rank {e['rank']}" if e.get("rank") is not None else "the batch script"
    return who + (f" on {e['node']}" if e.get("node") else "")


def error_said(e: dict) -> str:
    """What it reported in one line: message, the user's file:line, a hint for a known one."""
    return (e["message"] + (f" (at {e['at']})" if e.get("at") else "")
            + (f"; {e['hint']}" if e.get("hint") else ""))


def _last_checkpoint(job, run_dir: Path) -> str:
    from ..runs.attempts import checkpoint_root, newest_checkpoint

    if not job.train.checkpoint.enabled:
        return "checkpoints are off: its work is lost"
    newest = newest_checkpoint(checkpoint_root(job, run_dir))
    if newest is None:
        return "no checkpoint was saved"
    return f"the last checkpoint is step {newest[1].get('step')} ({newest[0]}); submit again to resume"


def _listed_progress(run_dir) -> dict | None:
    """progress.json for a line of a listing: one this user may not read leaves its line
    without progress (``status RUN`` of that run says permission denied)."""
    from ..runs.results import read_progress

    try:
        return read_progress(run_dir)
    except UserError:
        return None


def describe(run: str, workdir: str | Path | None = None) -> StatusRecord:
    """RUN (a job id, a run directory, or a job name: its latest run in the registry of
    ``workdir``, here by default) as Slurm and its run directory show it now. A job id
    submitted elsewhere is looked up in the registry of the directory Slurm says it came from."""
    from ..runs import attempts, jobs, registry, script_ranks
    from ..runs.results import Results, read_progress

    job_id, entry = registry.locate(Path(workdir or Path.cwd()), run)
    if entry is not None and entry.get("array"):
        array = entry["array"]
        raise UserError(f"job {job_id} is a job array of {len(array['indices'])} element(s) "
                        f"(sweep {array.get('sweep')}): `hpcsuite status {job_id}_INDEX` shows "
                        f"one, `hpcsuite sweep status {array.get('sweep_dir')}` all of them")
    try:
        state = registry.copied_state(entry) if entry and entry.get("remote") else jobs.query(job_id)
    except jobs.UnknownJob:
        if not never_ran(entry):
            raise
        state = jobs.never_ran(job_id)
    if entry is None and state.workdir:     # a job id from elsewhere: where it was submitted
        try:
            entry = registry.find(state.workdir, job_id)
        except (UserError, OSError):
            entry = None                    # not ours to read: Slurm's view alone
    run_dir = Path(entry["run_dir"]) if entry and entry.get("run_dir") else None
    rd = RunDir(run_dir) if run_dir else None
    from ..runtime.rank.job_io import load_job

    # Read whenever it is there: a damaged job.json is named (exit 2), never passed over.
    job = load_job(str(rd.job)) if rd and rd.job.is_file() else None
    errors = reported_errors(run_dir)
    return StatusRecord(
        job_id=job_id, state=state, entry=entry, run_dir=run_dir,
        progress=read_progress(run_dir) if run_dir else None,
        results=Results.load(rd.results) if rd and rd.results.is_file() else None,
        records=attempts.read_records(run_dir) if run_dir else [],
        error=errors[-1] if errors else None, errors=errors,
        script=script_ranks.read(run_dir) if run_dir else [],
        timeout_note=_last_checkpoint(job, run_dir) if state.state == "TIMEOUT" and job
        else None)


def describe_many(entries: list[dict], query=None) -> list[StatusRecord]:
    """The registry's entries as Slurm knows them now: one query for all of them. ``query``:
    the many-jobs state query, :func:`hpcsuite.runs.jobs.query_many` unless a caller (a study,
    a test) gives another; its :class:`~hpcsuite.errors.UserError` (Slurm cannot be asked)
    reaches the caller."""
    if query is None:
        from ..runs.jobs import query_many as query

    from ..runs.jobs import never_ran as never_ran_state
    from ..runs.registry import copied_state

    # an array: its elements; a copy fetched from a remote: what that Slurm said then
    ids = [e["job_id"] for e in entries if not e.get("array") and not e.get("remote")]
    states = query(ids) if ids else {}
    states.update({e["job_id"]: copied_state(e) for e in entries if e.get("remote")})
    return [StatusRecord.of_entry(e, states.get(e["job_id"]) or
                                  (never_ran_state(e["job_id"]) if never_ran(e) else None))
            for e in entries]


def never_ran(entry: dict | None) -> bool:
    """Whether a registry entry Slurm has no record of is an array element that never ran:
    one cancelled while it waited leaves no record and no run directory."""
    return bool(entry and entry.get("array_job_id") and entry.get("run_dir")
                and not Path(entry["run_dir"]).exists())


# Slurm's "signal" 53 (0:53): slurmd could not open the batch script's output or error file.
LOG_UNOPENED = 53


def exit_words(code: str, log: str | None = None) -> str:
    """Slurm's ``EXIT:SIGNAL`` in words: "exit 0:10 (the batch script was killed by SIGUSR1)"
    when a signal ended it (a warning signal that came before the script could trap it, in
    its first moments, or a kill); 0:53 is Slurm's for a log (``log``) it could not open."""
    import signal

    _, _, number = (code or "").partition(":")
    if number == str(LOG_UNOPENED):
        return (f"exit {code}: the batch script never started: Slurm could not open its log "
                f"{log or 'named by --output'}; the job's user must be able to create and "
                "write it on the compute node (the directory must exist there)")
    if number.isdigit() and int(number):
        try:
            name = signal.Signals(int(number)).name
        except ValueError:
            name = f"signal {number}"
        return f"exit {code} (the batch script was killed by {name})"
    return f"exit {code}"
