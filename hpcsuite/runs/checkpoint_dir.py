"""Every name in a checkpoint directory, and its one reader that needs no framework.

The directory (``train.checkpoint.dir``, else :attr:`~hpcsuite.runs.rundir.RunRoot.checkpoints`)::

    CKPT_ROOT/
        OWNER.json                   the live job writing here (:mod:`.attempts`)
        step-00000050/               one checkpoint, committed
            model.safetensors        (one file per tensor group, named in the manifest)
            manifest.json            step, cursor, seeds, ..., size + sha256 of every file
            COMMITTED                written last: the sha256 of manifest.json
        .tmp-step-00000060-HOST-PID/ a save under way (or killed): never read
        .trash-step-00000050-PID/    a step saved again, on its way out

:mod:`hpcsuite.runtime.session.checkpoint` writes and verifies checkpoints with these names;
:mod:`.attempts` reads the newest one's manifest before a submit and for ``status``.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "hpcsuite-checkpoint/1"   # the manifest's "format"
MANIFEST = "manifest.json"
MARKER = "COMMITTED"
OWNER = "OWNER.json"
STEP_PREFIX = "step-"
TMP_GLOB = f".tmp-{STEP_PREFIX}*"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def tmp_name(step: int, host: str, pid: int) -> str:
    """A save's directory until it is whole (``.tmp-step-N-HOST-PID``: the host and pid say
    whether the save that left it is still alive)."""
    return f".tmp-{step_name(step)}-{host}-{pid}"


def trash_name(step: int, pid: int) -> str:
    return f".trash-{step_name(step)}-{pid}"


def step_dirs(root: Path) -> list[Path]:
    """The ``step-*`` directories in ``root``, newest first (committed or not)."""
    if not root.is_dir():
        return []
    steps = []
    for p in root.glob(f"{STEP_PREFIX}*"):
        suffix = p.name[len(STEP_PREFIX):]
        if p.is_dir() and suffix.isdigit():
            steps.append((int(suffix), p))
    return [p for _, p in sorted(steps, reverse=True)]


def newest_checkpoint(root: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint's directory and manifest (read, not verified: the job
    verifies what it loads); None when there is none."""
    for path in step_dirs(root):
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(manifest, dict) and (path / MARKER).is_file():
            return path, manifest
    return None
