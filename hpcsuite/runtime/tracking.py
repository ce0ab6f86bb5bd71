"""Experiment tracking with MLflow (``train.tracking.mlflow``), written by rank 0.

The same points as the TensorBoard charts (:mod:`.tensorboard`), at the same call points: the
session's :class:`Charts` tells each of its charts every point (a training point at most every
``CHART_SECONDS``, validation, utilisation, the report's last points), and :class:`Tracker` is
a :class:`~.tensorboard.Chart` whose points go to MLflow. The resolved spec is logged as params
once per MLflow run; tags name the job, its Slurm job id, array element and attempt and the git
commit of the submit directory; results.json becomes an artifact once rank 0 has published it
(:meth:`Tracker.finish`), and `hpcsuite report` adds its plots (:func:`add_plots`).

One MLflow run per hpcsuite run: the store and run id are kept in the run directory's
mlflow.json, so a requeued or resumed attempt continues the same MLflow run (its metric history
spans the attempts, steps at the job's optimizer step; steps an attempt trains again after a
crash past its last checkpoint appear twice).

Never in training's way: MLflow is imported and called on a thread of its own (the import alone
takes seconds), which sends the points the training thread queued every :data:`FLUSH_SECONDS`
in ``log_batch`` calls. Anything going wrong (mlflow not installed, a store that cannot be
written, a server's error) is said in one warning line and ends tracking for the attempt. A
tracking server this node cannot reach (a compute node without a network: no TCP connection
within :data:`CONNECT_SECONDS`) makes rank 0 log to the run directory's ``mlruns/`` instead,
and the warning says where. MLflow 3 refuses its file store (in maintenance mode) unless
``MLFLOW_ALLOW_FILE_STORE`` is true: this module sets it in the rank's process for a file store.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from ..runs.attempts import SAVED, attempt_number
from ..runs.results import write_json_atomic
from ..runs.rundir import RunDir
from .job_io import hostname, job_id
from .tensorboard import Chart

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0      # queued points go to MLflow at least this often
CONNECT_SECONDS = 3.0    # a tracking server that takes longer to accept a connection: unreachable
FINISH_SECONDS = 20.0    # the most the end of an attempt waits for its last points and artifact
PARAM_CHARS = 6000       # MLflow's limit on a param's value
METRICS_PER_CALL = 1000  # log_batch's limits
PARAMS_PER_CALL = 100
_NOT_A_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")   # what MLflow refuses in a metric's name
# Asked of MLflow's HTTP client unless the environment says otherwise: a slow server costs
# the tracking thread tens of seconds at most, not MLflow's minutes of retries.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}


class Tracker(Chart):
    """Rank 0's MLflow run, fed like a TensorBoard chart; sent from a thread of its own."""

    def __init__(self, job, run_dir: Path, host: str):
        super().__init__(run_dir, host)
        self.job = job
        self.queue: list[tuple[str, float, int, int]] = []   # (key, value, ms, step)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.ending: tuple[Path | None, str] | None = None
        self.thread = threading.Thread(target=self._work, name="hpcsuite-mlflow", daemon=True)
        self.thread.start()

    # the training thread: queue, never wait
    def add(self, step: int, start_step: int, values: dict) -> None:
        if self.broken:
            return
        ms = int(time.time() * 1000)
        with self.lock:
            self.queue.extend((metric_key(k), float(v), ms, int(step))
                              for k, v in values.items() if v is not None)

    def flush(self) -> None:
        self.wake.set()

    def close(self) -> None:
        self.wake.set()

    def finish(self, results: Path | None, status: str) -> None:
        """After rank 0 published results.json: the last points, results.json and the run's
        status; waits for the thread at most :data:`FINISH_SECONDS`."""
        self.ending = (results, status)
        self.wake.set()
        self.thread.join(FINISH_SECONDS)
        if self.thread.is_alive() and not self.broken:
            log.warning("train.tracking.mlflow: the last points and results.json were not sent "
                        "within %.0f s; left unsent", FINISH_SECONDS)

    def give_up(self, e: BaseException) -> None:
        log.warning("train.tracking.mlflow: %s; no more MLflow logging this attempt", describe(e))
        self.broken = True

    # the tracking thread
    def _work(self) -> None:
        try:
            run = MlflowRun.open(self.job, RunDir(self.run_dir))
            while True:
                self.wake.wait(FLUSH_SECONDS)
                self.wake.clear()
                with self.lock:
                    points, self.queue = self.queue, []
                run.metrics(points)
                if self.ending is not None:
                    run.end(*self.ending)
                    return
        except BaseException as e:  # noqa: BLE001 - nothing MLflow raises may reach training
            self.give_up(e)


class Charts:
    """Rank 0's charts (TensorBoard's, MLflow's), each told every point: the session's one
    chart, whatever it writes to."""

    def __init__(self, charts: list[Chart]):
        self.charts = charts

    @classmethod
    def of(cls, *charts: Chart | None):
        """None, the one chart, or both."""
        kept = [c for c in charts if c is not None]
        return None if not kept else kept[0] if len(kept) == 1 else cls(kept)

    @property
    def last_step(self) -> int | None:
        working = [c.last_step for c in self.charts if not c.broken]
        return working[0] if working else None

    def due(self) -> bool:
        return any(c.due() for c in self.charts)

    def training(self, *args) -> None:
        for c in self.charts:
            c.training(*args)

    def add(self, *args) -> None:
        for c in self.charts:
            c.add(*args)

    def flush(self) -> None:
        for c in self.charts:
            c.flush()

    def close(self) -> None:
        for c in self.charts:
            c.close()


class MlflowRun:
    """The MLflow side (the tracking thread's): the client and the run it logs to."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id

    @classmethod
    def open(cls, job, paths: RunDir) -> "MlflowRun":
        """The run mlflow.json names, continued when its store is the one used now; else a new
        run in the job's experiment, with the spec as params, recorded in mlflow.json."""
        spec = job.train.tracking.mlflow
        record = read_record(paths.mlflow)
        uri = reachable(record.get("uri") or store_uri(spec.uri, paths), paths)
        client = client_for(uri)
        tags = run_tags(job, paths)
        if record.get("uri") == uri and record.get("run_id"):
            run_id = record["run_id"]
            client.update_run(run_id, "RUNNING")
            cls(client, run_id).tags(tags)
            log.info("MLflow: continuing run %s (attempt %d) in %s", run_id, attempt_number(), uri)
            return cls(client, run_id)
        name = spec.experiment or job.name
        experiment = experiment_id(client, name, uri)
        run = client.create_run(experiment, tags=tags, run_name=f"{job.name}-{paths.path.name}")
        made = cls(client, run.info.run_id)
        write_json_atomic(paths.mlflow, {"uri": uri, "run_id": made.run_id,
                                         "experiment": name, "experiment_id": experiment})
        made.params(flat_params(job.to_dict()))
        log.info("MLflow: run %s in experiment %r at %s", made.run_id, name, uri)
        return made

    def params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=items[i:i + PARAMS_PER_CALL])

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
        self.client.set_terminated(self.run_id, "FINISHED" if status == "completed" else
                                   "KILLED" if status in SAVED else "FAILED")


# ------------------------------------------------------------------- pure parts
def flat_params(spec: dict, prefix: str = "") -> dict[str, str]:
    """The resolved spec as MLflow params: ``train.lr`` -> ``"0.05"`` (JSON for everything but
    strings), nested mappings flattened, at most :data:`PARAM_CHARS` per value. ``env`` gives
    only its names: its values may be secrets a tracking server should not keep."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if name == "env":
            out[name] = ",".join(sorted(value))
        elif isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out[name] = text if len(text) <= PARAM_CHARS else text[:PARAM_CHARS - 3] + "..."
    return out


def metric_key(key: str) -> str:
    """A series' name as MLflow takes it (a script's run.log() may use any name)."""
    return _NOT_A_KEY.sub("_", key)


def store_uri(uri: str | None, paths: RunDir) -> str:
    """The spec's URI (a path made a file: URI), or the file store shared by the job name."""
    if uri is None:
        return paths.default_mlruns.as_uri()
    if uri.lower().startswith(("file:", "http://", "https://")):
        return uri
    return Path(uri).absolute().as_uri()      # a path, relative to the submit directory


def reachable(uri: str, paths: RunDir) -> str:
    """``uri``, or the run directory's file store where ``uri`` is a server this node cannot
    reach (said in one warning line)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return uri
    port = parts.port or (443 if scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), CONNECT_SECONDS).close()
        return uri
    except OSError as e:
        log.warning("train.tracking.mlflow.uri: cannot reach %s:%d from %s (%s); logging to %s "
                    "instead", parts.hostname, port, hostname(), e.strerror or e, paths.mlruns)
        return paths.mlruns.absolute().as_uri()


def run_tags(job, paths: RunDir) -> dict[str, str]:
    """The Slurm job, the array element (a sweep's: grouped by hpcsuite.sweep), the attempt,
    the git commit of the submit directory."""
    tags = {"hpcsuite.job": job.name, "hpcsuite.run_dir": str(paths.path.absolute()),
            "hpcsuite.attempt": str(attempt_number()), "hpcsuite.host": hostname(),
            "hpcsuite.spec_digest": job.digest()}
    if job_id():
        tags["hpcsuite.slurm_job_id"] = job_id()
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and index:          # only a sweep submits a job array
        tags.update({"hpcsuite.sweep": job.name, "hpcsuite.array_job_id": array,
                     "hpcsuite.array_index": index})
    commit = git_commit(Path.cwd())
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def git_commit(start: Path) -> str | None:
    """The commit checked out in the git work tree holding ``start``, read from its files (a
    compute node may have no git)."""
    for d in [start, *start.parents]:
        git = d / ".git"
        try:
            if git.is_file():          # a worktree or submodule: "gitdir: PATH"
                git = (d / git.read_text().split(":", 1)[1].strip()).resolve()
            if not git.is_dir():
                continue
            head = (git / "HEAD").read_text().strip()
            if not head.startswith("ref: "):
                return head or None
            common = git / (git / "commondir").read_text().strip() \
                if (git / "commondir").is_file() else git
            return _ref(common, head[5:])
        except (OSError, IndexError):
            return None
    return None


def _ref(git: Path, ref: str) -> str | None:
    loose = git / ref
    if loose.is_file():
        return loose.read_text().strip() or None
    packed = git / "packed-refs"
    for line in packed.read_text().splitlines() if packed.is_file() else []:
        if line.endswith(f" {ref}"):
            return line.split()[0]
    return None


# ------------------------------------------------------------------- MLflow's client
def client_for(uri: str):
    """MLflow's client for ``uri`` (importing mlflow: the tracking thread and `report` only)."""
    if uri.lower().startswith("file:"):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        Path(url2pathname(urlsplit(uri).path)).mkdir(parents=True, exist_ok=True)
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, uri: str) -> str:
    """The experiment called ``name``, created when missing. The elements of a sweep start
    together: a file store is locked while one looks and creates (it would make two of the
    same name), a server refuses the second, which then finds the first."""
    import fcntl

    lock = None
    if uri.lower().startswith("file:"):
        lock = open(Path(url2pathname(urlsplit(uri).path)) / ".hpcsuite-experiments.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name)
        except Exception:  # noqa: BLE001 - MlflowException: another job created it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id
    finally:
        if lock is not None:
            lock.close()


def read_record(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(e: BaseException) -> str:
    if isinstance(e, ImportError) and (e.name or "").startswith("mlflow"):
        return "mlflow is not installed where the ranks run (pip install 'hpcsuite[tracking]')"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def add_plots(run_dir: Path, plots: list[Path]) -> str | None:
    """`hpcsuite report`'s PNGs as artifacts (report/) of the run's MLflow run, when it has one
    (its mlflow.json); the line to print, or None for a run without tracking."""
    record = read_record(RunDir(run_dir).mlflow)
    if not record.get("run_id") or not plots:
        return None
    try:
        client = client_for(record["uri"])
        for path in plots:
            client.log_artifact(record["run_id"], str(path), "report")
    except Exception as e:  # noqa: BLE001 - the plots are drawn; say why MLflow has none
        return f"MLflow: plots not added to run {record['run_id']} ({describe(e)})"
    return f"MLflow: {len(plots)} plots added to run {record['run_id']} at {record['uri']}"
