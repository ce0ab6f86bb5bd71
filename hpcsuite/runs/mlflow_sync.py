"""`hpcsuite tracking sync`: runs' MLflow runs copied from the store their job logged to (the
file store a compute node can always write, on the shared filesystem) into a tracking server or
a SQLite database that the login node reaches: params, tags, every metric's whole history (its
steps and timestamps), artifacts, and the run's status, start and end times.

A copy carries the tag ``hpcsuite.source_run_id``: a later sync finds it and adds only what is
missing (points logged since, new artifacts, the status once the run ended), so a second sync
of an unchanged run adds nothing. An artifact the source holds otherwise than the copy (a
requeued job's results.json, `report`'s plots drawn again: MLflow overwrites them in the job's
store) is sent again: a different size, or a different SHA-256 than the copy's tag
``hpcsuite.source_artifact_sha256`` recorded when it was sent. MLflow is imported when a sync
runs, never with the module.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .mlflow_store import (artifact_location, client_for, failure_line, local_uri,
                           mlflow_environment, read_record, server_unreachable)
from .rundir import RunDir

SOURCE_TAG = "hpcsuite.source_run_id"
SOURCE_URI_TAG = "hpcsuite.source_uri"
# The copy's: {artifact path: SHA-256} of the source's artifacts as last sent, so that a later
# sync tells a changed artifact of the same size without downloading the copy's.
DIGESTS_TAG = "hpcsuite.source_artifact_sha256"
TAG_VALUE_CHARS = 8000      # MLflow's limit on a tag's value: more digests are not recorded
TARGET_HELP = "http(s)://HOST[:PORT] (a tracking server) or sqlite:///PATH (a database)"
METRICS_PER_CALL, PARAMS_PER_CALL, TAGS_PER_CALL = 1000, 100, 100   # log_batch's limits


@dataclass
class Synced:
    """One run directory's sync: what was added to the copy (none the second time)."""

    run_dir: str
    source_run: str | None = None
    target_run: str | None = None
    created: bool = False
    params: int = 0
    tags: int = 0
    metrics: int = 0        # metric points (a history's steps)
    artifacts: int = 0      # files sent
    artifacts_changed: int = 0     # of which the copy held an older version
    status: str | None = None          # the copy's status after the sync
    status_changed: bool = False
    skipped: str | None = None         # why there was nothing to copy
    error: str | None = None           # why the copy failed

    @property
    def added(self) -> bool:
        return bool(self.created or self.params or self.tags or self.metrics or self.artifacts
                    or self.status_changed)

    def line(self) -> str:
        if self.skipped or self.error:
            return f"{self.run_dir}: {'skipped' if self.skipped else 'failed'}: " \
                   f"{self.skipped or self.error}"
        head = f"{self.run_dir}: MLflow run {self.source_run} -> {self.target_run}"
        if not self.added:
            return f"{head}: up to date ({self.status}), nothing added"
        changed = f" ({self.artifacts_changed} changed)" if self.artifacts_changed else ""
        what = (f"{self.params} params, {self.tags} tags, {self.metrics} metric points, "
                f"{self.artifacts} artifacts{changed}")
        return f"{head}: {'created' if self.created else 'completed'} ({what}; {self.status})"

    def to_json(self) -> dict:
        return {**self.__dict__, "added": self.added}


def target_uri(to: str) -> str:
    """``to`` as the sync writes to it (a relative sqlite: path made absolute), or a UserError
    naming what it must be."""
    low = to.lower()
    if low.startswith(("http://", "https://")):
        unreachable = server_unreachable(to)
        if unreachable:
            raise UserError(f"--to {to}: {unreachable}")
        return to
    if low.startswith("sqlite:///") and to[len("sqlite:///"):].strip("/"):
        return local_uri(to)
    raise UserError(f"--to {to!r}: not a tracking server or database hpcsuite can sync to; "
                    f"use {TARGET_HELP}")


def sync(run_dirs: list[Path], to: str) -> list[Synced]:
    """Each run directory's MLflow run copied into ``to`` (see the module's doc)."""
    to = target_uri(to)
    with mlflow_environment():
        try:
            target = client_for(to)
        except Exception as e:  # noqa: BLE001 - MLflow's own failure, said in one line
            raise UserError(f"--to {to}: {failure_line(e)}") from None
        out = []
        for run_dir in run_dirs:
            try:
                out.append(sync_run(Path(run_dir), target, to))
            except Exception as e:  # noqa: BLE001 - one run's failure must not hide the others
                out.append(Synced(str(run_dir), read_record(RunDir(run_dir).mlflow).get("run_id"),
                                  error=failure_line(e)))
    return out


def sync_run(run_dir: Path, target, to: str) -> Synced:
    record = read_record(RunDir(run_dir).mlflow)
    done = Synced(str(run_dir), record.get("run_id"))
    if not record.get("run_id") or not record.get("uri"):
        done.skipped = "no MLflow run (no mlflow.json with a run: tracking off, or lost " \
                       "before rank 0 opened a run)"
        return done
    if local_uri(record["uri"]) == to:
        done.skipped = f"the run already logs to {to}"
        return done
    source = client_for(record["uri"])
    run = source.get_run(record["run_id"])
    experiment = target_experiment(target, source.get_experiment(run.info.experiment_id).name,
                                   to)
    found = target.search_runs([experiment], f"tags.`{SOURCE_TAG}` = '{run.info.run_id}'",
                               max_results=1)
    if found:
        copy = found[0]
    else:
        tags = {**run.data.tags, SOURCE_TAG: run.info.run_id, SOURCE_URI_TAG: record["uri"]}
        copy = target.create_run(experiment, start_time=run.info.start_time, tags=tags,
                                 run_name=run.info.run_name)
        done.created, done.tags = True, len(tags)
    done.target_run = copy.info.run_id
    add_params_and_tags(source_run=run, copy=copy, target=target, done=done)
    done.metrics = add_metrics(source, run, target, copy)
    done.artifacts, done.artifacts_changed = add_artifacts(source, run, target, copy)
    done.status, done.status_changed = end_like(run, target, copy)
    return done


def target_experiment(target, name: str, to: str) -> str:
    found = target.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return target.create_experiment(name, artifact_location(to))


def add_params_and_tags(source_run, copy, target, done: Synced) -> None:
    """Params the copy lacks (a param never changes), tags it lacks or holds otherwise."""
    from mlflow.entities import Param, RunTag

    have = target.get_run(copy.info.run_id).data
    params = [Param(k, v) for k, v in source_run.data.params.items() if k not in have.params]
    tags = [RunTag(k, v) for k, v in source_run.data.tags.items() if have.tags.get(k) != v]
    for i in range(0, len(params), PARAMS_PER_CALL):
        target.log_batch(copy.info.run_id, params=params[i:i + PARAMS_PER_CALL])
    for i in range(0, len(tags), TAGS_PER_CALL):
        target.log_batch(copy.info.run_id, tags=tags[i:i + TAGS_PER_CALL])
    done.params, done.tags = len(params), done.tags + len(tags)


def _point(m) -> tuple:
    value = m.value if m.value == m.value else "nan"     # NaN is never equal to itself
    return m.step, m.timestamp, value


def add_metrics(source, run, target, copy) -> int:
    """Every point of every metric's history the copy does not hold yet (step, timestamp and
    value alike); the number added."""
    from mlflow.entities import Metric

    have_keys = set(target.get_run(copy.info.run_id).data.metrics)
    missing = []
    for key in sorted(run.data.metrics):
        have = Counter(_point(m) for m in target.get_metric_history(copy.info.run_id, key)) \
            if key in have_keys else Counter()
        for m in source.get_metric_history(run.info.run_id, key):
            point = _point(m)
            if have[point]:
                have[point] -= 1
            else:
                missing.append(Metric(key, m.value, m.timestamp, m.step))
    for i in range(0, len(missing), METRICS_PER_CALL):
        target.log_batch(copy.info.run_id, metrics=missing[i:i + METRICS_PER_CALL])
    return len(missing)


def artifact_files(client, run_id: str, path: str | None = None) -> dict[str, int | None]:
    """Every artifact file of the run, by its path in the run: its size (None where the store
    does not say)."""
    out = {}
    for f in client.list_artifacts(run_id, path):
        out.update(artifact_files(client, run_id, f.path) if f.is_dir else {f.path: f.file_size})
    return out


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def add_artifacts(source, run, target, copy) -> tuple[int, int]:
    """Every artifact of the source run the copy lacks or holds otherwise (see the module's
    doc), then their digests recorded on the copy; (files sent, of which the copy held an
    older version)."""
    copy_id = copy.info.run_id
    have = artifact_files(target, copy_id)
    recorded = _recorded_digests(target.get_run(copy_id).data.tags.get(DIGESTS_TAG))
    digests, send, changed = {}, [], 0
    with tempfile.TemporaryDirectory(prefix="hpcsuite-sync-") as tmp:
        mine, theirs = Path(tmp, "source"), Path(tmp, "copy")
        mine.mkdir()
        theirs.mkdir()
        for path in sorted(artifact_files(source, run.info.run_id)):
            local = Path(source.download_artifacts(run.info.run_id, path, str(mine)))
            digests[path] = sha256(local)
            if path in have:
                if _holds(target, copy_id, path, have[path], recorded.get(path), local,
                          digests[path], theirs):
                    continue
                changed += 1
            send.append((path, local))
        for path, local in send:
            folder = str(Path(path).parent)
            target.log_artifact(copy_id, str(local), None if folder == "." else folder)
    now = {**recorded, **digests}
    text = json.dumps(now, sort_keys=True, separators=(",", ":"))
    if now != recorded and len(text) <= TAG_VALUE_CHARS:
        target.set_tag(copy_id, DIGESTS_TAG, text)
    return len(send), changed


def _holds(target, copy_id: str, path: str, size: int | None, sent: str | None, local: Path,
           digest: str, scratch: Path) -> bool:
    """Whether the copy's ``path`` (``size`` bytes, None: not said) is the source's file
    ``local`` (SHA-256 ``digest``): the same size, and the same digest as the one recorded when
    it was sent; a copy sent before digests were recorded is downloaded to compare."""
    if size is not None and size != local.stat().st_size:
        return False
    if sent is None:
        sent = sha256(target.download_artifacts(copy_id, path, str(scratch)))
    return sent == digest


def _recorded_digests(text: str | None) -> dict[str, str]:
    try:
        found = json.loads(text or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else {}


def end_like(run, target, copy) -> tuple[str, bool]:
    """The copy's status and end time made the source run's; (its status, whether it changed)."""
    now = target.get_run(copy.info.run_id).info
    status, end = run.info.status, run.info.end_time
    if now.status == status and (status == "RUNNING" or now.end_time == end):
        return status, False
    if status == "RUNNING":
        target.update_run(copy.info.run_id, status="RUNNING")
    else:
        target.set_terminated(copy.info.run_id, status, end_time=end)
    return status, True
