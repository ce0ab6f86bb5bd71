"""The job spec's ``train.tracking`` (experiment tracking with MLflow) and the site's default
tracking URI (the profile's ``tracking_uri``).

What a URI may be is checked here, on the login node, without MLflow: a file store (``file:``
or a plain path), a tracking server (``http(s)://HOST[:PORT]``) or a SQLite database
(``sqlite:///PATH``: one job's; the elements of a sweep write at once, and SQLite's locking on
a shared filesystem is not to be trusted, so the default stays the file store, which
``hpcsuite tracking sync`` copies into a server or database). Other databases are refused here
rather than on rank 0 hours later (their drivers are not installed). Rank 0 does the logging
(:mod:`hpcsuite.runtime.observe.tracking`); :func:`tracking_findings` warns when the job's Python has
no mlflow.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from typing import Optional
from urllib.parse import urlsplit

from ..records import Record, meta, record

SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
URI_HELP = "file:/PATH, a path, http(s)://HOST[:PORT][/PATH] or sqlite:///PATH"
EXPERIMENT_MAX = 200


def uri_problem(text: str) -> str | None:
    """Why ``text`` is not a tracking URI hpcsuite can log to, or None."""
    scheme = SCHEME.match(text)
    if scheme is None:          # a plain path (relative to the submit directory)
        return None
    name = scheme.group(1).lower()
    if name == "file":
        return None if text[5:].strip("/") else f"{text!r}: a file: URI needs a path"
    if name == "sqlite":
        path = text[len("sqlite:"):]
        if not path.startswith("///") or not path[3:].strip("/") or ":memory:" in path:
            return (f"{text!r}: a SQLite database is sqlite:///PATH (relative to the submit "
                    "directory) or sqlite:////ABSOLUTE/PATH")
        return None
    if name not in ("http", "https"):
        return (f"{text!r}: {name}: is not a tracking URI hpcsuite can use (no driver for that "
                f"database is installed); use {URI_HELP}, and `hpcsuite tracking sync` to copy "
                "runs into a tracking server")
    try:
        parts = urlsplit(text)
        parts.port        # raises on a port that is not a number in range
    except ValueError as e:
        return f"{text!r}: {e}"
    if not parts.hostname:
        return f"{text!r}: no host; use {URI_HELP}"
    return None


@record
class MlflowTracking(Record):
    """Where rank 0 logs the run: the spec as params, the Slurm job, array index, attempt and
    git commit as tags, the loss/lr/samples-per-second/validation/utilisation series as
    metrics (step: the job's optimizer step), results.json and `hpcsuite report`'s plots as
    artifacts. A requeued or resumed attempt continues the same MLflow run."""
    uri: Optional[str] = field(default=None, metadata=meta(
        "the MLflow tracking URI: " + URI_HELP + " (a path is relative to the submit "
        "directory). Unset: the site profile's tracking_uri, else a file store in "
        "OUTPUT_DIR/NAME/mlruns (`hpcsuite tracking sync` copies its runs into a server or a "
        "sqlite: database, which `mlflow ui` shows). A server rank 0 "
        "cannot reach (a compute node without a network) makes it log to the run directory's "
        "mlruns/ instead, which its log names", check=uri_problem, nonempty=True))
    experiment: Optional[str] = field(default=None, metadata=meta(
        "the MLflow experiment, created when missing. Unset: the job's name, so the elements of "
        "a sweep (named after it) share one, as do a study's points (named after the study); a "
        "sweep's elements are also tagged hpcsuite.sweep", nonempty=True,
        max_length=EXPERIMENT_MAX))


@record
class Tracking(Record):
    """Experiment tracking: rank 0 logs the run to MLflow."""
    mlflow: MlflowTracking = field(metadata=meta(
        "log the run to MLflow (needs the tracking extra, pip install 'hpcsuite[tracking]', "
        "where the ranks run); {} for the defaults"))


def with_site_uri(job, profile):
    """``job`` with the site profile's tracking_uri where it tracks and names no URI."""
    tracking = job.train.tracking
    if tracking is None or tracking.mlflow.uri or not profile.tracking_uri:
        return job
    mlflow = dataclasses.replace(tracking.mlflow, uri=profile.tracking_uri)
    train = dataclasses.replace(job.train, tracking=Tracking(mlflow))
    return dataclasses.replace(job, train=train)


# importlib.util.find_spec locates the package without importing it (mlflow takes seconds)
FIND_MLFLOW = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('mlflow') else 3)"


def tracking_problems(job, profile) -> list[str]:
    """Why train.tracking would log nothing: the Python the ranks run (the site profile's
    ``python``, else this one) cannot find mlflow. Asked without importing it; a job in a
    container image is not asked (its Python is the image's)."""
    import importlib.util
    import sys

    if job.train.tracking is None:
        return []
    job = with_site_uri(job, profile)
    store = store_problem(job.train.tracking.mlflow.uri, job.train.tracking.mlflow.experiment
                          or job.name)
    if job.container.image:
        return [store] if store else []
    python = profile.interpreter()
    if python == sys.executable:
        found = importlib.util.find_spec("mlflow") is not None
    else:
        from .. import slurm
        from ..errors import UserError

        try:
            found = slurm.call([python, "-c", FIND_MLFLOW], timeout=30,
                               check=False).returncode == 0
        except UserError:
            return [f"the site profile's python ({python}) cannot be run here to ask whether "
                    "it has mlflow"]
    if found:
        return [store] if store else []
    return ([store] if store else []) + [f"the job's Python ({python}) cannot find mlflow: the job would run without MLflow "
            "tracking (pip install 'hpcsuite[tracking]' there)"]


def store_problem(uri: str | None, experiment: str) -> str | None:
    """Why this user cannot log to the MLflow file store ``uri`` names (None: it can, or it is
    not a file store): the store, or the experiment's directory in it, is not writable here."""
    import os
    import pwd
    from pathlib import Path

    if not uri or uri.lower().startswith(("http:", "https:", "sqlite:")):
        return None
    if uri.lower().startswith("file:"):
        from urllib.request import url2pathname

        path = Path(url2pathname(urlsplit(uri).path))
    else:
        path = Path(uri)
    path = path.absolute()
    where = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    blocked = where if not os.access(where, os.W_OK | os.X_OK) else None
    if blocked is None and where == path:
        blocked = next((d for d in _experiment_dirs(path, experiment)
                        if not os.access(d, os.W_OK | os.X_OK)), None)
    if blocked is None:
        return None
    what = "the store" if blocked == where else f"experiment {experiment!r}'s directory"
    return (f"the MLflow file store {path}: {what} ({blocked}) is not writable by "
            f"{_user(pwd, os.getuid())}, so the job would run without tracking. A store users share "
            "needs a directory each of them can write (a group's, setgid, used with umask 002); "
            "or log to a store of your own (train.tracking.mlflow.uri) or to a server")


def _user(pwd, uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _experiment_dirs(store, experiment: str) -> list:
    """The store's directories of the experiment called ``experiment`` (meta.yaml's name),
    read without MLflow."""
    found = []
    try:
        entries = [d for d in store.iterdir() if d.is_dir() and (d / "meta.yaml").is_file()]
    except OSError:
        return found
    for d in entries:
        try:
            lines = (d / "meta.yaml").read_text(errors="replace").splitlines()
        except OSError:
            continue
        if any(line.strip() in (f"name: {experiment}", f"name: '{experiment}'") for line in lines):
            found.append(d)
    return found
