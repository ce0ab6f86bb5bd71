"""The batch script's `hpcsuite attempt end`, for a job that tracks: the attempt's MLflow run
ends as the attempt did (attempts.jsonl's outcome) where rank 0 did not end it.

- Rank 0 opened the run and left it RUNNING (it died, or its last points were not sent in
  time): :func:`close_run` gives it the attempt's status and tags.
- Rank 0 never opened one (a rank failed, or Slurm ended the job, before mlflow's import and
  the store were done; or tracking was lost first): :func:`make_run` makes the run rank 0
  would have made (:mod:`.mlflow_run`: its store, experiment, name, params, tags), ended with
  the attempt's status and the error its FAILED marker names, and records it in mlflow.json
  (``made_by``, ``made_in``), so `status` says who made it and why.

Neither may fail the batch script: what MLflow refuses is one line in the job's log
(:func:`end_attempt`). mlflow is imported only where there is a run to close or make.
"""

from __future__ import annotations

from pathlib import Path

from .mlflow_run import (experiment_id, experiment_name, log_params, run_name, run_params,
                         run_tags, store_from_here, store_uri)
from .mlflow_store import (MADE_BY_ATTEMPT_END, NEVER_OPENED, client_for, failure_line,
                           mlflow_environment, read_record, server_unreachable, update_record,
                           write_record)
from .rundir import RunDir

# attempt end's outcome -> the MLflow status of the attempt's run
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
TAG_CHARS = 500
MADE_BY_TAG = "hpcsuite.made_by"


def mlflow_status(outcome: str, requeued: bool, slurm_ended: bool) -> str:
    """The MLflow status of a run whose attempt ended as ``outcome`` (attempts.jsonl's) without
    rank 0 closing it: KILLED for a stop (a preemption, the time limit, a signal it stopped on
    without a checkpoint), for a failure hpcsuite requeues (the next attempt continues the
    run) and for an end Slurm made (a cancel); FAILED for a failure that ends the job,
    FINISHED for a completed attempt."""
    if outcome == "completed":
        return FINISHED
    if outcome in ("preempted", "time_limit", "stopped") or requeued or slurm_ended:
        return KILLED
    return FAILED


def end_attempt(job, run_dir: Path, out) -> None:
    """`attempt end`, once the attempt is recorded, for a job that tracks: the run rank 0 left
    open closed (:func:`close_run`), or the run it never opened made (:func:`make_run`), with
    the attempt's record (attempts.jsonl) and what its first failing rank said. Never raises:
    anything that goes wrong is one line for the job's log."""
    from .attempts import attempt_number

    if job.train.tracking is None:
        return
    try:
        said = _end(job, Path(run_dir), attempt_number())
    except Exception as e:  # noqa: BLE001 - the batch script's status is the launcher's
        said = f"hpcsuite: MLflow: attempt {attempt_number()}'s run not ended ({failure_line(e)})"
    if said:
        out(said)


def _end(job, run_dir: Path, n: int) -> str | None:
    from ..errors import UserError
    from .attempts import read_records, stop_signal

    try:
        entry = [r for r in read_records(run_dir) if r["attempt"] == n][-1]
    except (UserError, IndexError):
        return None     # no record of this attempt: nothing to say the run ended as
    stop = stop_signal(run_dir, n)
    ending = (n, entry["outcome"], bool(entry.get("requeued")),
              stop is not None and stop != job.train.preemption.signal,
              failure_said(RunDir(run_dir).failed(n)))
    if read_record(RunDir(run_dir).mlflow).get("run_id"):
        return close_run(run_dir, *ending)
    return make_run(job, run_dir, *ending)


def failure_said(marker: Path) -> str | None:
    """A FAILED marker's word on the failure: the exception it raised, else its first
    ``error:`` line, else its last line (None without a marker)."""
    try:
        lines = [l.strip() for l in marker.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return None
    raised = [l[len("raised: "):] for l in lines if l.startswith("raised: ")]
    errors = [l[len("error: "):] for l in lines[2:] if l.startswith("error: ")]
    return (raised or errors or lines[-1:] or [None])[0]


def ending_tags(attempt: int, outcome: str, requeued: bool, error: str | None) -> dict:
    """The tags that say how the attempt ended: ``hpcsuite.status`` (its outcome, requeued or
    not), ``hpcsuite.attempt`` and ``hpcsuite.error`` (what its first failing rank said)."""
    tags = {"hpcsuite.status": outcome + (", requeued" if requeued else ""),
            "hpcsuite.attempt": str(attempt)}
    if error:
        tags["hpcsuite.error"] = error[:TAG_CHARS]
    return tags


def close_run(run_dir: Path, attempt: int, outcome: str, requeued: bool = False,
              slurm_ended: bool = False, error: str | None = None) -> str | None:
    """The run rank 0 left open (it died, or its last points were not sent in time) gets the
    attempt's outcome as its status and :func:`ending_tags`; a run a later attempt continues
    stays resumable (mlflow.json is kept, and that attempt sets it RUNNING again). The line to
    print, or None when there was nothing to do."""
    path = RunDir(run_dir).mlflow
    record = read_record(path)
    if not record.get("run_id") or not record.get("uri"):
        return None
    if record.get("state") == "ended" and record.get("attempt") == attempt:
        return None               # rank 0 ended it
    status = mlflow_status(outcome, requeued, slurm_ended)
    run_id, uri = record["run_id"], record["uri"]
    try:
        unreachable = server_unreachable(uri)
        if unreachable:
            return f"hpcsuite: MLflow run {run_id} left as it was: {unreachable}"
        with mlflow_environment():
            client = client_for(uri)
            from mlflow.entities import RunTag

            tags = ending_tags(attempt, outcome, requeued, error)
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            client.set_terminated(run_id, status)
    except Exception as e:  # noqa: BLE001 - the attempt's record matters more than MLflow's
        return f"hpcsuite: MLflow run {run_id} left as it was: {failure_line(e)}"
    lost = record.get("state") == "lost" and record.get("attempt") == attempt
    update_record(path, status=status, closed_by="attempt end",
                  **({} if lost else {"attempt": attempt, "state": "ended"}))  # a loss stays said
    return f"hpcsuite: MLflow run {run_id} ended {status} (attempt {attempt} {outcome})"


def make_run(job, run_dir: Path, attempt: int, outcome: str, requeued: bool = False,
             slurm_ended: bool = False, error: str | None = None) -> str:
    """The run of an attempt whose rank 0 never opened one, made as rank 0 would have made it
    (the run directory's file store where the spec's server is out of reach from here, as on
    rank 0), with :func:`ending_tags`, ``hpcsuite.made_by``, results.json when this attempt
    published one, and the attempt's status; recorded in mlflow.json, so that `status` says
    it and a requeued attempt continues it. A loss rank 0 recorded stays said. The line to
    print."""
    paths = RunDir(run_dir)
    asked = store_uri(job.train.tracking.mlflow.uri, paths)
    uri, fell_back = store_from_here(asked, paths)
    name, status = experiment_name(job), mlflow_status(outcome, requeued, slurm_ended)
    tags = {**run_tags(job, paths), **ending_tags(attempt, outcome, requeued, error),
            MADE_BY_TAG: MADE_BY_ATTEMPT_END}
    record = read_record(paths.mlflow)
    lost = record.get("state") == "lost" and record.get("attempt") == attempt
    now = {} if lost else {"attempt": attempt, "state": "ended", "error": None}
    run_id = None
    try:
        with mlflow_environment():
            client = client_for(uri)
            experiment = experiment_id(client, name, uri)
            run_id = client.create_run(experiment, tags=tags,
                                       run_name=run_name(job, paths)).info.run_id
            write_record(paths.mlflow, {      # at once: a later attempt continues this run
                **record, "uri": uri, "run_id": run_id, "experiment": name,
                "experiment_id": experiment, "asked": asked, "fell_back": fell_back,
                "made_by": MADE_BY_ATTEMPT_END, "made_in": attempt, "status": None, **now})
            log_params(client, run_id, run_params(job, uri, name))
            if paths.attempt_results(attempt).is_file() and paths.results.is_file():
                client.log_artifact(run_id, str(paths.results))
            client.set_terminated(run_id, status)
    except Exception as e:  # noqa: BLE001 - the attempt's record matters more than MLflow's
        said = failure_line(e)
        if run_id is not None and not lost:
            update_record(paths.mlflow, attempt=attempt, state="lost", error=said)
        return f"hpcsuite: no MLflow run made for attempt {attempt} ({NEVER_OPENED}): {said}"
    update_record(paths.mlflow, status=status, closed_by=MADE_BY_ATTEMPT_END)
    return (f"hpcsuite: MLflow run {run_id} made {status} by attempt end ({NEVER_OPENED}; "
            f"attempt {attempt} {outcome}) at {uri}")
