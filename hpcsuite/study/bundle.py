"""A study's bundle: the names of its files, the copy of its inputs and their sha256, its
record of versions. What a study directory holds is :mod:`hpcsuite.study.points`'s docstring."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import UserError

if TYPE_CHECKING:
    from ..submit.spec import JobSpec


class Bundled(Protocol):
    """What this module needs of a study directory (:class:`hpcsuite.study.points.StudyDir`, which
    imports this module: naming it here would make the two import each other)."""

    path: Path

    def bundle(self) -> dict: ...

STUDY_FILE = "study.yaml"
POINTS_FILE = "points.json"
STATE_FILE = "state.json"
BUNDLE_FILE = "bundle.json"
MANIFEST = "inputs.sha256"
ENVIRONMENT = "environment.json"
# A bundle copies the base spec's directory; these never belong in it.
SKIPPED_DIRS = {"runs", "studies", "__pycache__", "node_modules"}
MAX_BUNDLE_FILES = 2000
MAX_BUNDLE_BYTES = 512 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def copy_inputs(src: Path, dest: Path, exclude: Path | None = None) -> int:
    """Copy the base spec's directory into the bundle (hidden entries, run and study
    directories left out); the number of files."""
    count = size = 0
    for root, dirs, files in os.walk(src):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS
                         and not (exclude and (here / d).resolve() == exclude.resolve()))
        for name in sorted(files):
            path = here / name
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            count += 1
            size += path.stat().st_size
            if count > MAX_BUNDLE_FILES or size > MAX_BUNDLE_BYTES:
                raise UserError(f"{src}: more than {MAX_BUNDLE_FILES} files or "
                                f"{MAX_BUNDLE_BYTES >> 20} MiB; a study bundle copies the base "
                                "spec's directory, so keep the base spec in a project directory "
                                "of its own (large data can stay outside, by absolute path)")
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return count


def external_inputs(job: JobSpec) -> list[str]:
    """Absolute paths the job reads that a bundle records by hash instead of copying."""
    paths = [job.train.data.path] if job.train.data.path else []
    if job.train.eval and job.train.eval.data and job.train.eval.data.path:
        paths.append(job.train.eval.data.path)
    for ref in (job.train.model, job.train.loss, job.train.data.factory, job.train.script):
        if ref and (ref.endswith(".py") or ".py:" in ref):
            paths.append(ref.split(":")[0] if ".py:" in ref else ref)
    return sorted({p for p in paths if Path(p).is_absolute()})


def write_manifest(study_dir: Path, external: dict[str, str]) -> None:
    lines = []
    for path in sorted(study_dir.rglob("*")):
        rel = path.relative_to(study_dir)
        # Hidden files and directories are bookkeeping, not inputs (the run registry that
        # submitting from inputs/ leaves in inputs/.hpcsuite/, editors' swap files).
        if not path.is_file() or rel.parts[0] in ("runs", "report") or rel.name in (
                MANIFEST, STATE_FILE, "allreduce.yaml") or any(p.startswith(".") for p in rel.parts):
            continue
        lines.append(f"{file_sha256(path)}  {rel}")
    lines += [f"{digest}  {path}" for path, digest in sorted(external.items())]
    (study_dir / MANIFEST).write_text("\n".join(lines) + "\n")


def read_manifest(study_dir: Path) -> dict[str, str]:
    path = study_dir / MANIFEST
    if not path.is_file():
        raise UserError(f"{study_dir}: not a study bundle (no {MANIFEST})")
    out = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name:
            out[name] = digest
    return out


def verify_bundle(study_dir: Path) -> None:
    """Refuse a bundle whose inputs no longer match their recorded sha256."""
    for name, digest in read_manifest(study_dir).items():
        path = Path(name) if Path(name).is_absolute() else study_dir / name
        if not path.is_file():
            raise UserError(f"{study_dir}/{MANIFEST}: {name} is missing")
        if file_sha256(path) != digest:
            raise UserError(f"{study_dir}/{MANIFEST}: {name} changed since the study was made "
                            "(sha256 differs)")


def write_environment(study_dir: Path, ask: bool = True) -> None:
    """environment.json: the versions (:mod:`hpcsuite.study.env`). ``ask=False`` (a dry run)
    takes the tools' answers from the installation's cache only; the ones it lacks are marked
    pending and asked by the first real run (:func:`complete_environment`)."""
    from .env import environment

    (study_dir / ENVIRONMENT).write_text(json.dumps(environment(ask=ask), indent=2) + "\n")


def complete_environment(sd: Bundled) -> None:
    """Ask the tools a dry run left pending, and re-record the bundle's sha256."""
    from .env import pending

    path = sd.path / ENVIRONMENT
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and not pending(recorded):
        return
    write_environment(sd.path)
    write_manifest(sd.path, sd.bundle().get("external", {}))
