"""The job spec's ``train.tracking`` (experiment tracking with MLflow) and the site's default
tracking URI (the profile's ``tracking_uri``).

What a URI may be is checked here, on the login node, without MLflow: a file store (``file:``
or a plain path) or a tracking server (``http(s)://HOST[:PORT]``). mlflow-skinny, the extra
hpcsuite asks for, has no database store, so ``sqlite:``/``postgresql:`` and the like are
refused here rather than on rank 0 hours later. Rank 0 does the logging
(:mod:`hpcsuite.runtime.tracking`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from typing import Optional
from urllib.parse import urlsplit

from ..records import Record, meta, record

SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
URI_HELP = "file:/PATH, a path, or http(s)://HOST[:PORT][/PATH]"
EXPERIMENT_MAX = 200


def uri_problem(text: str) -> str | None:
    """Why ``text`` is not a tracking URI hpcsuite can log to, or None."""
    scheme = SCHEME.match(text)
    if scheme is None:          # a plain path (relative to the submit directory)
        return None
    name = scheme.group(1).lower()
    if name == "file":
        return None if text[5:].strip("/") else f"{text!r}: a file: URI needs a path"
    if name not in ("http", "https"):
        return (f"{text!r}: {name}: is not a tracking URI hpcsuite can use (mlflow-skinny has no "
                f"database store); use {URI_HELP}")
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
        "OUTPUT_DIR/NAME/mlruns (`mlflow ui --backend-store-uri` reads it). A server rank 0 "
        "cannot reach (a compute node without a network) makes it log to the run directory's "
        "mlruns/ instead, which its log names", check=uri_problem, nonempty=True))
    experiment: Optional[str] = field(default=None, metadata=meta(
        "the MLflow experiment, created when missing. Unset: the job's name, so the elements of "
        "a sweep (named after it) share one, as do a study's points (named after the study); a "
        "sweep's elements are also tagged hpcsuite.sweep", nonempty=True,
        max_length=EXPERIMENT_MAX))


@record
class Tracking(Record):
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
