"""The run registry: one line per submit, in the directory jobs were submitted from.

``.hpcsuite/runs.jsonl`` beside the specs a user submits, so ``hpcsuite runs`` finds them
again days later, after Slurm has forgotten the jobs. Each submit appends one JSON line under
an exclusive lock (``flock``): many submits at once never interleave or lose a line. What the
line points at (the rendered script, the resolved job and profile) lives in the run directory;
the line itself stays small.

A job array (``hpcsuite sweep``) is one line with ``array: {sweep, sweep_dir, indices}`` and
``run_dir`` its run root; its elements are not lines of their own: :func:`elements` derives
each one's entry (Slurm's id ``ARRAYID_INDEX``, its run directory), and :func:`find` knows them.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import subprocess
from pathlib import Path

from ..errors import UserError
from .rundir import RunDir, RunRoot, element_id

DIRNAME = ".hpcsuite"
FILENAME = "runs.jsonl"


ENV = "HPCSUITE_REGISTRY"


def path_in(workdir: str | Path) -> Path:
    """The registry of ``workdir``: its .hpcsuite/runs.jsonl, or that of the directory
    ``HPCSUITE_REGISTRY`` names (a remote's working directory keeps one registry for the jobs
    submitted from each job's own directory: hpcsuite.remote)."""
    return Path(os.environ.get(ENV) or workdir) / DIRNAME / FILENAME


def git_state(directory: str | Path) -> dict:
    """{"commit", "dirty"} of the git repository ``directory`` is in (both None outside one);
    "dirty": that directory has changes not committed."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--", ".")) if commit else None}


def record(workdir: str | Path, entry: dict) -> None:
    """Append ``entry`` (with the time) to the registry of ``workdir``."""
    path = path_in(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"submitted_at": dt.datetime.now().isoformat(timespec="seconds"), **entry},
                      sort_keys=True, ensure_ascii=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = line.encode()
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)   # closing releases the lock


def load(workdir: str | Path) -> list[dict]:
    """Every run recorded in ``workdir``, oldest first ([] when nothing was submitted here)."""
    path = path_in(workdir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise UserError(f"{path}: cannot read the run registry ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    finally:
        os.close(fd)
    runs = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("job_id"), str) \
                or not isinstance(entry.get("run_dir"), str) or not _array_ok(entry):
            raise UserError(f"{path}:{number}: not a run record (the file is damaged); remove "
                            "that line to go on")
        runs.append(entry)
    return runs


def _array_ok(entry: dict) -> bool:
    array = entry.get("array")
    if array is None:
        return True
    indices = array.get("indices") if isinstance(array, dict) else None
    return isinstance(indices, list) and all(type(i) is int and 0 <= i < 10**7 for i in indices)


def elements(entry: dict) -> list[dict]:
    """The entries of a job array's elements ([] for a plain job): each with the id Slurm shows
    for it (``ARRAYID_INDEX``), its run directory, its index and the array's id."""
    array = entry.get("array")
    if not array:
        return []
    root = RunRoot(entry["run_dir"])
    shared = {k: entry.get(k) for k in ("name", "spec", "spec_digest", "template", "script",
                                         "git", "submitted_at")}
    out = []
    for index in array["indices"]:
        job_id = element_id(entry["job_id"], index)
        out.append({**shared, "job_id": job_id, "run_dir": str(root.run(job_id).path),
                    "array_job_id": entry["job_id"], "index": index,
                    "sweep": array.get("sweep")})
    return out


def expand(entries: list[dict]) -> list[dict]:
    """``entries`` with each job array followed by its elements."""
    return [e for entry in entries for e in (entry, *elements(entry))]


def find(workdir: str | Path, run: str) -> dict | None:
    """The run ``run`` names: a job id (an array's element: ARRAYID_INDEX), a run directory,
    or a job name (its latest run)."""
    runs = expand(load(workdir))
    for entry in reversed(runs):
        if run in (entry["job_id"], entry["run_dir"]):
            return entry
    target = Path(run)
    if target.exists():
        resolved = str(target.resolve())
        for entry in reversed(runs):
            if str(Path(entry["run_dir"]).resolve()) == resolved:
                return entry
    for entry in reversed(runs):
        # a name is a plain job's: a sweep's elements are named by id (`hpcsuite sweep status`)
        if entry.get("name") == run and not entry.get("array") and "array_job_id" not in entry:
            return entry
    return None


def locate(workdir: str | Path, run: str) -> tuple[str, dict | None]:
    """(job id, registry entry or None) for RUN as a user types it: a job id, a run directory,
    or a job name (its latest run) from the registry of ``workdir``."""
    from ..errors import show
    from .jobs import _check_id

    entry = find(workdir, run)
    if entry is not None:
        return entry["job_id"], entry
    if run[:1].isdigit() and not Path(run).is_dir():
        return _check_id(run), None      # a job id, or one error saying it is not one
    submitted = RunDir(run).submit
    if submitted.is_file():
        try:
            job_id = str(json.loads(submitted.read_text())["job_id"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{submitted}: not a submit record (damaged?)") from None
        return job_id, {"job_id": job_id, "run_dir": str(Path(run).resolve())}
    raise UserError(f"no run {show(run)} in {path_in(workdir)}: give a job id, a run directory, "
                    "or the name of a job submitted from here (`hpcsuite runs` lists them)")


def copied_state(entry: dict):
    """The state of a run copied from a remote (`hpcsuite fetch`): what that cluster's Slurm
    said when it was fetched, kept in the registry entry; this machine's Slurm, if any, is
    another cluster and is not asked."""
    said = entry.get("slurm") if isinstance(entry.get("slurm"), dict) else {}

    def text(key: str) -> str | None:
        value = said.get(key)
        return str(value) if value is not None else None

    restarts = said.get("restarts")
    from .jobs import JobState

    return JobState(entry["job_id"], text("state") or "UNKNOWN", text("exit_code") or "",
                    None, None, text("reason"), elapsed=text("elapsed"),
                    restarts=restarts if isinstance(restarts, int) else None,
                    max_rss=text("max_rss"), source=f"remote {entry.get('remote')}, when fetched")
