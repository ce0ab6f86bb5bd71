"""A run's MLflow record (the run directory's mlflow.json) and MLflow's client for its store.

Rank 0 (:mod:`hpcsuite.runtime.observe.tracking`) writes mlflow.json: where the run logs (``uri``,
``run_id``, ``experiment``, ``experiment_id``), what it was asked (``asked``: the spec's or the
site's store) and what became of tracking in the latest attempt (``attempt``, ``state``:
logging, ended or lost; ``fell_back``: why it logs to the run directory instead of the server
asked; ``error``: why tracking was lost; ``status``: MLflow's status when ended; ``made_by``
and ``made_in``: the batch script's `attempt end` made the run, in that attempt, because rank
0 never opened one). `status` and `submit --wait` say it in one line (:func:`summary_line`);
the batch script's `hpcsuite attempt end` closes a run rank 0 left RUNNING, or makes the one
it never opened (:mod:`.mlflow_end`).

MLflow itself is imported only inside :func:`client_for`: by rank 0's tracking thread,
`report`, `tracking sync` and an `attempt end` that has a run to close or make. MLflow 3
refuses its file store (in maintenance mode) unless ``MLFLOW_ALLOW_FILE_STORE`` is true, and
reads its HTTP client's timeouts from the environment at each request: whoever uses a client
does so inside :func:`mlflow_environment`, which sets both and puts the environment back
after, so a login-node command leaves its environment as it found it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from .rundir import RunDir

ALLOW = "MLFLOW_ALLOW_FILE_STORE"
# Asked of MLflow's HTTP client unless the environment says otherwise: a slow server costs
# the caller tens of seconds at most, not MLflow's minutes of retries; and no "View run ... at"
# line on stdout when a run on a server ends (`tracking sync --json` prints JSON alone there).
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
INSTALL = "pip install 'hpcsuite[tracking]'"
# mlflow.json's ``made_by`` for a run `attempt end` made (hpcsuite.runs.mlflow_end), and why
MADE_BY_ATTEMPT_END = "attempt end"
NEVER_OPENED = "rank 0 never opened one"
# The commit and state of the submit directory's git tree when the job was submitted: the
# runner hands them to sbatch, the batch script's environment keeps them (a requeue too), and
# rank 0 tags the run with them.
GIT_COMMIT, GIT_DIRTY = "HPCSUITE_GIT_COMMIT", "HPCSUITE_GIT_DIRTY"


def read_record(path: Path) -> dict:
    """mlflow.json as a dict ({} when missing or damaged: tracking then starts afresh); one
    this user may not read is said as that."""
    try:
        data = json.loads(Path(path).read_text())
    except PermissionError:
        from ..errors import permission_denied

        raise permission_denied(path) from None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(path: Path, record: dict) -> None:
    """mlflow.json, renamed into place (`status` may be reading it)."""
    from .results import write_json_atomic

    write_json_atomic(path, record)


def update_record(path: Path, **fields) -> dict:
    record = {**read_record(path), **fields}
    write_record(path, record)
    return record


def is_file_uri(uri: str) -> bool:
    return uri.lower().startswith("file:")


def file_path(uri: str) -> Path:
    """The directory a file: URI names."""
    from urllib.request import url2pathname   # http.client, ssl, email: not on the login path

    return Path(url2pathname(urlsplit(uri).path))


def local_uri(uri: str) -> str:
    """``uri`` with its path made absolute against this directory: a plain path becomes a file:
    URI, a sqlite: database given relative (``sqlite:///m.db``, three slashes) absolute
    (``sqlite:////DIR/m.db``); a server and a file: URI as given."""
    if uri.lower().startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        return uri if path.startswith("/") else "sqlite:///" + str(Path(path).absolute())
    if uri.lower().startswith(("file:", "http://", "https://")):
        return uri
    return Path(uri).absolute().as_uri()


def artifact_location(uri: str) -> str | None:
    """Where a new experiment in the store ``uri`` keeps its runs' artifacts: for a sqlite:
    database the directory ``mlartifacts`` beside it (MLflow's default would be ./mlruns of
    whichever directory the writer runs in); None (the store's own) for the others."""
    if not uri.lower().startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).absolute().parent / "mlartifacts").as_uri()


@contextlib.contextmanager
def mlflow_environment():
    """The environment MLflow reads while its client is used here: ``MLFLOW_ALLOW_FILE_STORE``
    true, and :data:`HTTP_DEFAULTS` where the environment sets none; every variable as it was
    after. Nests (an inner one changes nothing an outer one set)."""
    changes = {ALLOW: "true", **{k: v for k, v in HTTP_DEFAULTS.items() if k not in os.environ}}
    before = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def client_for(uri: str):
    """MLflow's client for ``uri`` (a file: store made when missing, a server, a database);
    importing mlflow here."""
    if is_file_uri(uri):
        file_path(uri).mkdir(parents=True, exist_ok=True)
    from mlflow.tracking import MlflowClient

    with mlflow_environment():       # MLflow makes (and caches) a file store only while allowed
        return MlflowClient(tracking_uri=uri)


def failure_line(e: BaseException) -> str:
    """An MLflow failure in one line: its type and first line (an ImportError of mlflow also
    says what to install)."""
    first = str(e).splitlines()[0] if str(e) else ""
    text = f"{type(e).__name__}: {first}".rstrip(": ")
    if isinstance(e, ImportError) and (e.name or "").startswith("mlflow"):
        text += f" (mlflow is not installed where the ranks run: {INSTALL})"
    return text


# ------------------------------------------------------------------- what status says
def summary(run_dir: str | Path) -> dict | None:
    """What became of the run's tracking (mlflow.json), for `status --json` and `submit --wait
    --json`; None for a run that does not track (or whose rank 0 has not started it yet)."""
    record = read_record(RunDir(run_dir).mlflow)
    if not record:
        return None
    keys = ("uri", "run_id", "experiment", "asked", "fell_back", "attempt", "state", "status",
            "error", "made_by", "made_in")
    return {k: record.get(k) for k in keys}


def summary_line(run_dir: str | Path) -> str | None:
    """The one line `status` and `submit --wait` print about MLflow: the run, its store and
    status, and who made it when rank 0 did not; where it fell back to and why; what lost it."""
    s = summary(run_dir)
    if s is None:
        return None
    parts = []
    if s["run_id"]:
        said = [s["status"]] if s["state"] in ("ended", "lost") and s["status"] else []
        if s["made_by"]:
            said.append(f"made by {s['made_by']}: {NEVER_OPENED}" if s["made_in"] == s["attempt"]
                        else f"made by attempt {s['made_in']}'s end: its {NEVER_OPENED}")
        status = f" ({', '.join(said)})" if said else ""
        parts.append(f"run {s['run_id']}{status}, experiment {s['experiment']!r}, at {s['uri']}")
    if s["fell_back"]:
        parts.append(f"fell back to {s['uri']} ({s['fell_back']})")
    if s["state"] == "lost":
        parts.append(f"lost in attempt {s['attempt']}: {s['error']}")
    return "MLflow: " + "; ".join(parts) if parts else None


# ------------------------------------------------------------------- the store
def server_unreachable(uri: str, seconds: float = 3.0) -> str | None:
    """Why the tracking server ``uri`` names cannot be reached from here, or None (a file
    store, a database, or a server that accepts a connection within ``seconds``)."""
    import socket

    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return None
    port = parts.port or (443 if scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), seconds).close()
        return None
    except OSError as e:
        return (f"server {parts.hostname}:{port} not reachable from {socket.gethostname()} "
                f"({e.strerror or e})")


def add_plots(run_dir: Path, plots: list[Path]) -> str | None:
    """`hpcsuite report`'s PNGs as artifacts (report/) of the run's MLflow run, when it has one
    (its mlflow.json); the line to print, or None for a run without tracking."""
    record = read_record(RunDir(run_dir).mlflow)
    if not record.get("run_id") or not plots:
        return None
    try:
        with mlflow_environment():
            client = client_for(record["uri"])
            for path in plots:
                client.log_artifact(record["run_id"], str(path), "report")
    except Exception as e:  # noqa: BLE001 - the plots are drawn; say why MLflow has none
        return f"MLflow: plots not added to run {record['run_id']} ({failure_line(e)})"
    return f"MLflow: {len(plots)} plots added to run {record['run_id']} at {record['uri']}"
