"""What hpcsuite puts in a job's MLflow run, whoever makes it: rank 0's tracking thread
(:mod:`hpcsuite.runtime.observe.tracking`) or, when rank 0 never opened one, the batch script's
`attempt end` (:mod:`.mlflow_end`). The store (the spec's, else the file store shared by the
job name; the run directory's when a server cannot be reached), the experiment (created under a
lock), the run's name, its params (the resolved spec) and its tags (the job, its Slurm ids, the
attempt, the git commit recorded at submit).

Nothing here imports mlflow: the functions that talk to a store take MLflow's client.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..world import current
from .mlflow_store import (GIT_COMMIT, GIT_DIRTY, artifact_location, file_path, is_file_uri,
                           local_uri, server_unreachable)
from .rundir import RunDir

log = logging.getLogger(__name__)

PARAM_CHARS = 6000       # MLflow's limit on a param's value
PARAMS_PER_CALL = 100    # log_batch's limit
CONNECT_SECONDS = 3.0    # a tracking server that takes longer to accept a connection: unreachable
# What the managed loop reads and a script is never given (its own model, data, optimizer,
# precision and gradient exchange): left out of a script's params.
SCRIPT_IGNORES = ("train.model", "train.model_args", "train.loss", "train.data", "train.eval",
                  "train.lr", "train.optimizer", "train.schedule", "train.precision",
                  "train.ledger", "train.horovod.compression", "train.horovod.op",
                  "train.horovod.allreduce")


# ------------------------------------------------------------------- where and what
def store_uri(uri: str | None, paths: RunDir) -> str:
    """The spec's URI (a path made a file: URI), or the file store shared by the job name."""
    if uri is None:
        return paths.default_mlruns.as_uri()
    return local_uri(uri)


def store_from_here(uri: str, paths: RunDir,
                    seconds: float = CONNECT_SECONDS) -> tuple[str, str | None]:
    """(``uri``, None), or (the run directory's file store, why) where ``uri`` is a server
    this node cannot reach within ``seconds``."""
    why = server_unreachable(uri, seconds)
    if why is None:
        return uri, None
    return paths.mlruns.absolute().as_uri(), f"{uri}: {why}"


def experiment_name(job) -> str:
    return job.train.tracking.mlflow.experiment or job.name


def run_name(job, paths: RunDir) -> str:
    return f"{job.name}-{paths.path.name}"


def flat_params(spec: dict, prefix: str = "") -> dict[str, str]:
    """The resolved spec as MLflow params: ``train.lr`` -> ``"0.05"`` (JSON for everything but
    strings), nested mappings flattened, at most :data:`PARAM_CHARS` per value. ``env`` gives
    only its names (``{}`` for none): its values may be secrets a tracking server should not
    keep."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if name == "env":
            out[name] = ",".join(sorted(value)) or "{}"
        elif isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out[name] = text if len(text) <= PARAM_CHARS else text[:PARAM_CHARS - 3] + "..."
    return out


def run_params(job, uri: str, experiment: str) -> dict[str, str]:
    """The params of a new MLflow run: the resolved spec (in script mode without what only the
    managed loop reads, :data:`SCRIPT_IGNORES`), with the store and experiment actually used."""
    params = flat_params(job.to_dict())
    if job.train.script is not None:
        params = {k: v for k, v in params.items()
                  if not any(k == i or k.startswith(i + ".") for i in SCRIPT_IGNORES)}
    params["train.tracking.mlflow.uri"] = uri
    params["train.tracking.mlflow.experiment"] = experiment
    return params


def log_params(client, run_id: str, params: dict[str, str]) -> None:
    """``params`` sent in as few ``log_batch`` calls as MLflow allows."""
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), PARAMS_PER_CALL):
        client.log_batch(run_id, params=items[i:i + PARAMS_PER_CALL])


def run_tags(job, paths: RunDir) -> dict[str, str]:
    """The Slurm job, the array element (a sweep's: grouped by hpcsuite.sweep), the attempt,
    the git commit recorded at submit and whether the tree had changes not committed."""
    world = current()
    tags = {"hpcsuite.job": job.name, "hpcsuite.run_dir": str(paths.path.absolute()),
            "hpcsuite.attempt": str(world.attempt), "hpcsuite.host": world.node,
            "hpcsuite.spec_digest": job.digest()}
    if world.job_id:
        tags["hpcsuite.slurm_job_id"] = world.job_id
    array, index = world.array_job_id, world.array_task_id
    if array and index:          # only a sweep submits a job array
        tags.update({"hpcsuite.sweep": job.name, "hpcsuite.array_job_id": array,
                     "hpcsuite.array_index": index})
    return {**tags, **git_tags()}


# ------------------------------------------------------------------- the git commit
def git_tags() -> dict[str, str]:
    """``mlflow.source.git.commit`` and ``hpcsuite.git_dirty``: as the runner recorded them at
    submit (the tree may have moved on while the job queued); a script run by hand, outside a
    job hpcsuite submitted, reads the working tree."""
    if GIT_COMMIT in os.environ:
        commit, dirty = os.environ[GIT_COMMIT], os.environ.get(GIT_DIRTY, "")
    else:
        commit, dirty = git_commit(Path.cwd()), ""
    tags = {"mlflow.source.git.commit": commit} if commit else {}
    if commit and dirty in ("true", "false"):
        tags["hpcsuite.git_dirty"] = dirty
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


# ------------------------------------------------------------------- the experiment
LOCK = ".hpcsuite-experiments.lock"


def store_lock(store: Path) -> int:
    """A descriptor to flock of the file store's lock, whoever made it: every user of a shared
    store (a 1777 directory) takes the same lock. Only read (flock needs no write access), and
    made readable by all whatever the umask (it holds nothing); a lock another user's umask
    kept from this one falls back to a lock of this user's own."""
    path = store / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.fchmod(fd, 0o644)
        return fd
    except FileExistsError:
        pass
    try:
        return os.open(path, os.O_RDONLY)
    except PermissionError:
        log.warning("%s: permission denied: this user's experiments are created under a lock "
                    "of its own", path)
        return os.open(store / f"{LOCK}.{os.getuid()}", os.O_RDONLY | os.O_CREAT, 0o600)


def experiment_id(client, name: str, uri: str) -> str:
    """The experiment called ``name``, created when missing. The elements of a sweep start
    together: a file store is locked while one looks and creates (it would make two of the
    same name), a server refuses the second, which then finds the first."""
    import fcntl

    lock = store_lock(file_path(uri)) if is_file_uri(uri) else None
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name, artifact_location(uri))
        except Exception:  # noqa: BLE001 - MlflowException: another job created it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id
    finally:
        if lock is not None:
            os.close(lock)
