"""What a study's results depend on: the versions of the software, recorded in its bundle.

Package versions come from their metadata (no framework is imported). The tools' own answers
(Horovod's build as ``horovodrun --check-build`` marks it, asked of horovod.torch and
horovod.tensorflow by ``doctor.horovod_build``; ``mpirun --version``; ``sbatch --version``) take
up to seconds (the build imports each framework), so each answer is cached per
installation: the key is what the answer depends on (the Python, the packages' versions, the
mtimes of Horovod's files and of the tools' executables), so a rebuilt Horovod or an upgraded
MPI is asked again and nothing else is. A tool that fails or does not answer in time records
``{"error": "..."}``, never nothing, and is not cached: the next study asks again. The report
and ``study compare`` turn those into one-line warnings (:func:`warnings`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ..runs.results import write_json_atomic

log = logging.getLogger(__name__)

# Tools' answers that are cached per installation; the rest of the record is read each time.
TOOLS = ("horovod_build", "mpi", "slurm")
# The ones that answer in well under a second; Horovod's build imports every framework (~7 s
# on the local cluster's 2 cores), so a dry run leaves it to the first real run.
QUICK = ("mpi", "slurm")
CACHE_FORMAT = 1


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcsuite"


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def packages() -> dict:
    """Versions read from package metadata: cheap, read every time."""
    from .. import __version__

    return {
        "hpcsuite": __version__,
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "tensorflow": (_version("tensorflow") or _version("tensorflow-cpu")
                       or _version("tensorflow_cpu")),
        "horovod": _version("horovod"),
        "numpy": _version("numpy"),
    }


def _stamp(path: str | Path | None) -> list:
    """A file's identity for the cache key: resolved path, size, mtime; [] when absent."""
    if not path:
        return []
    try:
        p = Path(path).resolve()
        st = p.stat()
    except OSError:
        return []
    return [str(p), st.st_size, st.st_mtime_ns]


def _horovod_files() -> list:
    """The newest mtime and the count of Horovod's installed files (its compiled extensions
    change when it is rebuilt, even at the same version), found without importing it."""
    from importlib.util import find_spec

    try:
        spec = find_spec("horovod")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    newest, count = 0, 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                newest = max(newest, (Path(folder) / name).stat().st_mtime_ns)
            except OSError:
                continue
            count += 1
    return [str(root), count, newest]


def installation_key(versions: dict) -> str:
    """What the tools' answers depend on, hashed: Python, package versions, Horovod's files,
    the executables of horovodrun, mpirun and sbatch."""
    python = Path(sys.executable)
    parts = {
        "format": CACHE_FORMAT, "python": _stamp(python), "prefix": sys.prefix,
        "versions": {k: v for k, v in versions.items() if k != "hpcsuite"},
        "horovod_files": _horovod_files(),
        "horovodrun": _stamp(python.parent / "horovodrun"),
        "mpirun": _stamp(shutil.which("mpirun")), "sbatch": _stamp(shutil.which("sbatch")),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _first_line(argv: list[str], timeout: float) -> str | dict:
    """The first line a tool prints, or {"error": why}."""
    from .. import slurm
    from ..errors import UserError

    try:
        done = slurm.call(argv, timeout=timeout, check=False)
    except UserError as e:
        return {"error": str(e)}
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"{argv[0]} exit {done.returncode}: "
                         f"{lines[-1] if lines else 'no output'}"}
    return lines[0]


def _horovod_build() -> dict:
    """What this Horovod was built with, as ``doctor`` reads it: {frameworks, controllers,
    operations} (sorted lists), or {"error": why}."""
    from ..site.doctor import horovod_build

    build = horovod_build(sys.executable)
    if "error" in build:
        return {"error": build["error"]}
    return {k: sorted(build[k]) for k in ("frameworks", "controllers", "operations")}


def ask_tools(names: tuple[str, ...] | list[str], horovod: bool) -> dict:
    """The tools' answers, asked side by side (the slowest, Horovod's build, sets the time)."""
    askers: dict[str, Callable[[], object]] = {
        "horovod_build": (_horovod_build if horovod else lambda: None),
        "mpi": lambda: _first_line(["mpirun", "--version"], 60),
        "slurm": lambda: _first_line(["sbatch", "--version"], 30),
    }
    with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
        futures = {name: pool.submit(askers[name]) for name in names}
        return {name: f.result() for name, f in futures.items()}


def failed(value) -> bool:
    return isinstance(value, dict) and "error" in value


def answered(value) -> bool:
    """A tool's answer worth caching: neither a failure nor left for later."""
    return not (isinstance(value, dict) and ("error" in value or "pending" in value))


def pending(record: dict) -> list[str]:
    """The tools a dry run left for the first real run to ask."""
    return [k for k, v in record.items() if isinstance(v, dict) and "pending" in v]


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if k in TOOLS and answered(v)} \
        if isinstance(data, dict) else {}


def _write_cache(path: Path, answers: dict) -> None:
    """Best effort: an unwritable cache only means asking again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, answers)
    except OSError as e:
        log.debug("environment cache %s not written: %s", path, e)


PENDING = {"pending": "not cached for this installation when the study was made with "
                      "--dry-run; the first `study run` asks"}


def environment(ask: bool = True, cache: Path | None = None,
                asker: Callable[[list[str], bool], dict] | None = None) -> dict:
    """Everything a result depends on. The tools' answers come from the cache of this
    installation when it has them; the ones asked now are cached unless they failed. With
    ``ask=False`` the slow ones the cache lacks are left :data:`PENDING`."""
    record = packages()
    path = (cache or cache_dir()) / "environment" / f"{installation_key(record)}.json"
    known = _read_cache(path)
    missing = [name for name in TOOLS if name not in known and (ask or name in QUICK)]
    known.update({name: dict(PENDING) for name in TOOLS if name not in known
                  and name not in missing})
    if missing:
        asked = (asker or ask_tools)(missing, record["horovod"] is not None)
        known.update(asked)
        kept = {k: v for k, v in known.items() if answered(v)}
        if any(not failed(v) for v in asked.values()):
            _write_cache(path, kept)
    record.update({name: known.get(name) for name in TOOLS})
    record.update(host=os.uname().nodename, made=dt.datetime.now().isoformat(timespec="seconds"))
    return record


def warnings(env: dict, where: str = "") -> list[str]:
    """One line per tool whose answer the record lacks."""
    label = f"{where}: " if where else ""
    return [f"warning: {label}environment.json: {key} was not recorded ({value['error']}); "
            "results are not affected, but comparisons of it are blind"
            for key, value in env.items() if failed(value)] + \
           [f"warning: {label}environment.json: {key} not asked yet (made by a dry run)"
            for key in pending(env)]


def summary(value) -> str:
    """A value of the record on one short line: a build as its parts, long text cut."""
    if isinstance(value, str) and "Available Frameworks" in value:
        from ..site.doctor import parse_check_build   # a bundle made before builds were parsed

        value = {k: sorted(v) for k, v in parse_check_build(value).items()}
    if failed(value):
        return f"(not recorded: {value['error']})"
    if isinstance(value, dict) and "pending" in value:
        return "(not asked yet)"
    if isinstance(value, dict):
        return "; ".join(f"{k} {', '.join(v) if isinstance(v, list) else v}"
                         for k, v in sorted(value.items()))
    text = "-" if value is None else str(value)
    line = text.splitlines()[0] if text.strip() else text
    return line if len(line) <= 80 and line == text else line[:77] + "..."
