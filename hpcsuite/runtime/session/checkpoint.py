"""Checkpoints, framework-free: safetensors files plus a JSON manifest, committed atomically.

Layout of one checkpoint::

    CKPT_ROOT/step-00000050/
        model.safetensors        tensors, no pickle anywhere
        optimizer.safetensors
        manifest.json            step, sharding cursor, seeds, world size, spec digest,
                                 versions, backend extras, and size + sha256 of every file
        COMMITTED                written last: the sha256 of manifest.json

A save writes everything into ``.tmp-step-N-<host>-<pid>/``, fsyncs each file and the
directory, then renames it to ``step-N`` and fsyncs the parent. A save killed at any point
leaves only a ``.tmp-*`` directory, which :meth:`CheckpointStore.latest` never considers.
``latest`` also verifies the marker, the manifest and every file's size and hash, and skips a
checkpoint that fails with a warning, falling back to the one before. The directory's names
are :mod:`hpcsuite.runs.checkpoint_dir`'s, which the login node reads too.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...runs.checkpoint_dir import (FORMAT, MANIFEST, MARKER, TMP_GLOB, step_dirs, step_name,
                                   tmp_name, trash_name)

log = logging.getLogger(__name__)

CHUNK = 32 << 20


class CheckpointError(UserError):
    """A checkpoint that cannot be used or saved (the message says which file and why): the
    rank ends with exit 2 and that one line."""


@dataclass(frozen=True)
class Loaded:
    path: Path
    manifest: dict
    tensors: dict[str, dict[str, np.ndarray]] = field(repr=False)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


@dataclass(frozen=True)
class Saved:
    path: Path
    seconds: float
    bytes: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_hashed(path: Path, data: bytes | memoryview, hash_it: bool = True) -> str:
    """Write ``data`` and fsync it; sha256 it on a second thread while the writes run."""
    view = memoryview(data)
    digest = hashlib.sha256()
    with open(path, "wb") as f, ThreadPoolExecutor(1) as pool:
        pending = None
        for start in range(0, len(view), CHUNK):
            chunk = view[start:start + CHUNK]
            if pending:
                pending.result()
            if hash_it:
                pending = pool.submit(digest.update, chunk)   # hashlib releases the GIL
            f.write(chunk)
        if pending:
            pending.result()
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointStore:
    def __init__(self, root: Path, keep: int = 2):
        self.root = Path(root)
        self.keep = keep

    # ---------------------------------------------------------------- saving
    def save(self, step: int, tensors: dict[str, dict[str, np.ndarray]], manifest: dict) -> Saved:
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        self._clean_stale_tmp()
        name = step_name(step)
        tmp = self.root / tmp_name(step, socket.gethostname(), os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            total, files = self._write(tmp, step, tensors, manifest)
        except OSError as e:
            # A full disk or quota, an I/O error: the new checkpoint is incomplete, so it
            # goes; the ones before it are untouched (nothing is renamed or pruned until
            # the new one is whole).
            shutil.rmtree(tmp, ignore_errors=True)
            kept = next((p.name for p in step_dirs(self.root) if (p / MARKER).is_file()), None)
            raise CheckpointError(
                f"{e.filename or tmp}: saving the checkpoint of step {step} failed: "
                f"{e.strerror or e}; " + (f"the previous checkpoint {self.root / kept} is intact"
                                         if kept else "there is no earlier checkpoint")) from None
        final = self.root / name
        if final.exists():                       # the same step saved again (after a resume)
            trash = self.root / trash_name(step, os.getpid())
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(self.root)
        self._prune()
        return Saved(final, time.perf_counter() - t0, total)

    def _write(self, tmp: Path, step: int, tensors, manifest: dict) -> tuple[int, dict]:
        from safetensors.numpy import save as to_bytes

        files = {}
        total = 0
        for group, arrays in tensors.items():
            # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
            blob = to_bytes({k: np.require(v, requirements="C") for k, v in arrays.items()})
            fname = f"{group}.safetensors"
            files[fname] = {"bytes": len(blob), "sha256": write_hashed(tmp / fname, blob)}
            total += len(blob)
        body = dict(manifest, format=FORMAT, step=step, files=files,
                    created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        text = json.dumps(body, indent=2, sort_keys=True).encode() + b"\n"
        write_hashed(tmp / MANIFEST, text, hash_it=False)
        write_hashed(tmp / MARKER, hashlib.sha256(text).hexdigest().encode() + b"\n", hash_it=False)
        _fsync_dir(tmp)
        return total, files

    def _prune(self) -> None:
        good = [p for p in step_dirs(self.root) if (p / MARKER).is_file()]
        for old in good[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def _clean_stale_tmp(self) -> None:
        """Remove .tmp-* left by saves that died on this host (their pid is gone)."""
        host = socket.gethostname()
        for p in self.root.glob(TMP_GLOB):
            owner = p.name.rsplit("-", 2)
            if len(owner) == 3 and owner[1] == host and owner[2].isdigit():
                try:
                    os.kill(int(owner[2]), 0)
                except ProcessLookupError:
                    shutil.rmtree(p, ignore_errors=True)
                except PermissionError:
                    pass

    # ---------------------------------------------------------------- loading
    def verify(self, path: Path) -> dict:
        """The manifest of a complete, intact checkpoint, or CheckpointError saying why not."""
        marker = path / MARKER
        if not marker.is_file():
            raise CheckpointError(f"{path}: incomplete (no {MARKER} marker)")
        try:
            text = (path / MANIFEST).read_bytes()
        except OSError as e:
            raise CheckpointError(f"{path / MANIFEST}: unreadable ({e.strerror})") from None
        if hashlib.sha256(text).hexdigest().encode() != marker.read_bytes().strip():
            raise CheckpointError(f"{path / MANIFEST}: does not match its {MARKER} marker")
        try:
            manifest = json.loads(text)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path / MANIFEST}: invalid JSON ({e.msg})") from None
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{path / MANIFEST}: unknown format {manifest.get('format')!r}")
        for fname, info in manifest.get("files", {}).items():
            f = path / fname
            if not f.is_file():
                raise CheckpointError(f"{f}: missing")
            if f.stat().st_size != info["bytes"]:
                raise CheckpointError(f"{f}: {f.stat().st_size} bytes, manifest says {info['bytes']}")
            if _sha256_file(f) != info["sha256"]:
                raise CheckpointError(f"{f}: content does not match its sha256 (corrupt)")
        return manifest

    def load(self, path: Path) -> Loaded:
        from safetensors.numpy import load_file

        manifest = self.verify(path)
        tensors = {}
        for fname in manifest["files"]:
            try:
                tensors[fname[: -len(".safetensors")]] = load_file(str(path / fname))
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{path / fname}: unreadable safetensors ({e})") from None
        return Loaded(path, manifest, tensors)

    def latest(self) -> Loaded | None:
        """The newest checkpoint that verifies; a damaged newer one is skipped with a warning.
        None only where there is no checkpoint at all: when every one is damaged, a
        CheckpointError naming the newest (a fresh start would silently lose the run)."""
        problems = []
        for path in step_dirs(self.root):
            try:
                return self.load(path)
            except CheckpointError as e:
                log.warning("skipping checkpoint: %s", e)
                problems.append(str(e))
        if problems:
            raise CheckpointError(
                f"{problems[0]}; no intact checkpoint in {self.root} "
                f"({len(problems)} damaged) to resume from. To start over, move the directory "
                "away or set train.checkpoint.resume: false with another train.checkpoint.dir")
        return None
