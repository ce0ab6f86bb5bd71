"""Experiment tracking with MLflow (``train.tracking.mlflow``), written by rank 0.

The same points as the TensorBoard charts (:mod:`.tensorboard`), at the same call points: the
session's :class:`.chart.Charts` tells each of its charts every point (a training point at most every
``CHART_SECONDS``, validation, utilisation, the report's last points), and :class:`Tracker` is
a :class:`.chart.Chart` whose points go to MLflow. The resolved spec is logged as params
once per MLflow run; tags name the job, its Slurm job id, array element and attempt and the git
commit recorded at submit (a dirty tree said); results.json becomes an artifact once rank 0 has
published it (:meth:`Tracker.finish`), and `hpcsuite report` adds its plots.

One MLflow run per hpcsuite run: the store and run id are kept in the run directory's
mlflow.json, so a requeued or resumed attempt continues the same MLflow run (its metric history
spans the attempts, steps at the job's optimizer step; steps an attempt trains again after a
crash past its last checkpoint appear twice).

Never in training's way: MLflow is imported and called on a thread of its own (the import alone
takes seconds), which sends the points the training thread queued every :data:`FLUSH_SECONDS`
in ``log_batch`` calls. Anything going wrong (mlflow not installed, a store that cannot be
written, a server's error) is said in one warning line and ends tracking for the attempt. A
tracking server this node cannot reach (a compute node without a network: no TCP connection
within :data:`~hpcsuite.runs.mlflow_run.CONNECT_SECONDS`) makes rank 0 log to the run
directory's ``mlruns/`` instead, and the warning says where. What became of tracking (the run,
a fall-back and why, a loss and its error) is kept in mlflow.json for `status` and `submit
--wait` (:mod:`hpcsuite.runs.mlflow_store`, which also makes MLflow's client). What a run holds
(its store, experiment, name, params and tags) is :mod:`hpcsuite.runs.mlflow_run`'s, which the
batch script's `attempt end` shares when it makes the run of an attempt whose rank 0 never
opened one (:mod:`hpcsuite.runs.mlflow_end`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

from ...runs.attempts import SAVED, attempt_number
from ...runs.mlflow_run import (experiment_id, experiment_name, log_params, run_name,
                                run_params, run_tags, store_from_here, store_uri)
from ...runs.mlflow_store import (client_for, failure_line, mlflow_environment, read_record,
                                  update_record, write_record)
from ...runs.rundir import RunDir, RunRoot
from ..rank.job_io import job_id
from .chart import Paced

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0      # queued points go to MLflow at least this often
FINISH_SECONDS = 20.0    # the most the end of an attempt waits for its last points and artifact
OPEN_SECONDS = 120.0     # ... and, before that, for the run to open (mlflow's import, the store)
METRICS_PER_CALL = 1000  # log_batch's limit
_NOT_A_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")   # what MLflow refuses in a metric's name


class Tracker(Paced):
    """Rank 0's MLflow run as a chart (:class:`.chart.Chart`); sent from a thread of its own."""

    def __init__(self, job, run_dir: Path, host: str):
        super().__init__()
        self.job, self.run_dir, self.host = job, Path(run_dir), host
        self.queue: list[tuple[str, float, int, int]] = []   # (key, value, ms, step)
        self.stamped: dict[str, int] = {}                     # each key's last ms
        self.tags: dict[str, str] = {}                        # sent with the next points
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.ending: tuple[Path | None, str] | None = None
        self.opened = threading.Event()     # the MLflow run is open (or tracking gave up)
        self.lost: str | None = None        # why tracking gave up
        self.thread = threading.Thread(target=self._work, name="hpcsuite-mlflow", daemon=True)

    def start(self) -> "Tracker":
        """Start the tracking thread: it opens the MLflow run and sends what is queued."""
        self.thread.start()
        return self

    # the training thread: queue, never wait
    def add(self, step: int, start_step: int, values: dict) -> None:
        if self.broken:
            return
        ms = int(time.time() * 1000)
        with self.lock:
            for name, value in values.items():
                if value is None:
                    continue
                # Each key's points get distinct, rising times: a database store keeps one
                # point per (key, step, time, value), and the other ranks' utilisation comes
                # at the end, all at once (two samples at the last step with the same memory
                # would be one point after `tracking sync` to sqlite or a server).
                key = metric_key(name)
                at = self.stamped[key] = max(ms, self.stamped.get(key, -1) + 1)
                self.queue.append((key, float(value), at, int(step)))

    def tag(self, tags: dict[str, str]) -> None:
        with self.lock:
            self.tags.update(tags)

    def resumed(self, checkpoint: Path, from_job: str | None) -> None:
        """Rank 0 resumed from ``checkpoint``, written by job ``from_job``: a run that began
        in another job (a resubmission) is tagged with it and the MLflow run it continues."""
        if not from_job or from_job == job_id():
            return          # a requeued attempt: the same MLflow run goes on
        tags = {"hpcsuite.resumed_from": str(checkpoint), "hpcsuite.resumed_from_job": from_job}
        earlier = read_record(RunRoot(self.run_dir.parent).run(from_job).mlflow).get("run_id")
        if earlier:
            tags["hpcsuite.continues_run"] = earlier
        self.tag(tags)

    def flush(self) -> None:
        self.wake.set()         # the tracking thread sends what is queued now

    def close(self) -> None:
        """No more points: what is queued is sent now. The run itself ends in :meth:`finish`,
        once rank 0 has published results.json."""
        self.flush()

    def finish(self, results: Path | None, status: str) -> None:
        """After rank 0 published results.json: the last points, results.json and the run's
        status. A short attempt may end before its MLflow run is open (importing mlflow takes
        seconds, far more on a loaded node): that waits at most :data:`OPEN_SECONDS`, or only
        :data:`FINISH_SECONDS` for an attempt Slurm is stopping (its signal's grace is short),
        then the rest at most :data:`FINISH_SECONDS`. What was not sent is recorded as lost."""
        self.ending = (results, status)
        self.wake.set()
        wait = FINISH_SECONDS if status in SAVED else OPEN_SECONDS
        if not self.opened.wait(wait):
            self.give_up(TimeoutError(f"the MLflow run was not open {wait:.0f} s after the "
                                      "attempt's end (importing mlflow or reaching its store "
                                      "took that long); its points were not sent"))
            return
        self.thread.join(FINISH_SECONDS)
        if self.thread.is_alive() and not self.broken:
            self.give_up(TimeoutError(f"the last points and results.json were not sent within "
                                      f"{FINISH_SECONDS:.0f} s of the attempt's end"))

    def give_up(self, e: BaseException) -> None:
        self.opened.set()
        said = self.lost = failure_line(e)
        log.warning("train.tracking.mlflow: %s; no more MLflow logging this attempt", said)
        self.broken = True
        try:    # for `status` and `submit --wait`
            update_record(RunDir(self.run_dir).mlflow, attempt=attempt_number(), state="lost",
                          error=said)
        except OSError as oe:
            log.warning("train.tracking.mlflow: cannot record the loss in %s (%s)",
                        RunDir(self.run_dir).mlflow, oe.strerror or oe)

    # the tracking thread
    def _work(self) -> None:
        try:
            with mlflow_environment():
                self._log()
        except BaseException as e:  # noqa: BLE001 - nothing MLflow raises may reach training
            self.give_up(e)

    def _log(self) -> None:
        """Open the run, then send what the charts queued until the session ends it."""
        run = MlflowRun.open(self.job, RunDir(self.run_dir))
        if self.broken:     # the attempt ended first and gave up waiting: the loss stands
            update_record(RunDir(self.run_dir).mlflow, state="lost", error=self.lost)
            return
        self.opened.set()
        while True:
            self.wake.wait(FLUSH_SECONDS)
            self.wake.clear()
            with self.lock:
                points, self.queue = self.queue, []
                tags, self.tags = self.tags, {}
            run.metrics(points)
            if tags:
                run.tags(tags)
            if self.ending is not None:
                run.end(*self.ending)
                return


class MlflowRun:
    """The MLflow side (the tracking thread's): the client and the run it logs to."""

    def __init__(self, client, run_id: str, record: Path | None = None):
        self.client, self.run_id = client, run_id
        self._record = record       # mlflow.json

    @classmethod
    def open(cls, job, paths: RunDir) -> "MlflowRun":
        """The run mlflow.json names, continued when its store is the one used now; else a new
        run in the job's experiment, with the spec as params, recorded in mlflow.json."""
        record = read_record(paths.mlflow)
        asked = record.get("uri") or store_uri(job.train.tracking.mlflow.uri, paths)
        uri, fell_back = reachable(asked, paths)
        client = client_for(uri)
        tags = run_tags(job, paths)
        now = {"attempt": attempt_number(), "state": "logging", "error": None, "status": None}
        if record.get("uri") == uri and record.get("run_id"):
            run_id = record["run_id"]
            client.update_run(run_id, "RUNNING")
            made = cls(client, run_id, paths.mlflow)
            made.tags(tags)
            update_record(paths.mlflow, **now)
            log.info("MLflow: continuing run %s (attempt %d) in %s", run_id, attempt_number(), uri)
            return made
        name = experiment_name(job)
        experiment = experiment_id(client, name, uri)
        run = client.create_run(experiment, tags=tags, run_name=run_name(job, paths))
        made = cls(client, run.info.run_id, paths.mlflow)
        write_record(paths.mlflow, {"uri": uri, "run_id": made.run_id, "experiment": name,
                                    "experiment_id": experiment, "asked": asked,
                                    "fell_back": fell_back, **now})
        made.params(run_params(job, uri, name))
        log.info("MLflow: run %s in experiment %r at %s", made.run_id, name, uri)
        return made

    def params(self, params: dict[str, str]) -> None:
        log_params(self.client, self.run_id, params)

    def tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def metrics(self, points: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric

        items = [Metric(*p) for p in points]
        for i in range(0, len(items), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=items[i:i + METRICS_PER_CALL])

    def end(self, results: Path | None, status: str) -> None:
        if results is not None and Path(results).is_file():
            self.client.log_artifact(self.run_id, str(results))
        self.tags({"hpcsuite.status": status})
        ended = "FINISHED" if status == "completed" else "KILLED" if status in SAVED else "FAILED"
        self.client.set_terminated(self.run_id, ended)
        update_record(self._record, attempt=attempt_number(), state="ended", status=ended)


# ------------------------------------------------------------------- pure parts
def metric_key(key: str) -> str:
    """A series' name as MLflow takes it (a script's run.log() may use any name)."""
    return _NOT_A_KEY.sub("_", key)


def reachable(uri: str, paths: RunDir) -> tuple[str, str | None]:
    """(``uri``, None), or (the run directory's file store, why) where ``uri`` is a server
    this node cannot reach (said in one warning line)."""
    used, fell_back = store_from_here(uri, paths)
    if fell_back is not None:        # "URI: why"
        log.warning("train.tracking.mlflow.uri: %s; logging to %s instead", fell_back, paths.mlruns)
    return used, fell_back
