"""What `hpcsuite fetch` reads and decides before it copies anything: the remote's file
listing, which files are missing or changed here, where each one lands, the batches it goes
in, and the names refused. Pure: no ssh, no subprocess."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..runs import rundir
from .ssh import RemoteError

BATCH_BYTES = 64 << 20     # one tar stream: lost work on an interrupt is at most this much
STAGING = ".fetch-partial-{job_id}"
STATE = ".fetched.json"    # in the local run directory: {key: [remote size, mtime]} as copied
# Where each part lands below DEST/NAME; the key of a file is PART/RELATIVE.
RUN, ROOT, CHECKPOINTS = "run", "root", "checkpoints"
_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class RemoteFile:
    """One file of the manifest: its part, its name relative to the part's base, size, mtime."""
    part: str
    name: str
    size: int
    mtime: int

    @property
    def key(self) -> str:
        return f"{self.part}/{self.name}"


@dataclass(frozen=True)
class Layout:
    """Where a fetched run lives here: ``DEST/NAME/JOBID``, and each part's base."""
    dest: Path
    name: str
    job_id: str

    @property
    def root(self) -> rundir.RunRoot:
        return rundir.RunRoot.of(self.dest, self.name)

    @property
    def run_dir(self) -> Path:
        return self.root.run(self.job_id).path

    @property
    def staging(self) -> Path:
        return self.dest / STAGING.format(job_id=self.job_id)

    @property
    def state(self) -> Path:
        return self.run_dir / STATE

    def base(self, part: str) -> Path:
        return {RUN: self.run_dir, ROOT: self.root.path, CHECKPOINTS: self.root.checkpoints}[part]

    def local(self, f: RemoteFile) -> Path:
        return self.base(f.part) / f.name


def check_component(value: str, what: str) -> str:
    """``value`` as one safe path component (a job name or id), or a one-line error."""
    if not _ID.fullmatch(value) or value in (".", "..") or value.startswith("."):
        raise RemoteError(f"{what} {value!r} is not one file name hpcsuite fetches into")
    return value


def check_name(name: str) -> str:
    """A manifest's relative name, refused when it is absolute, empty or climbs (``..``)."""
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or "\0" in name or any(p in ("..", ".") for p in parts) \
            or name != "/".join(parts):
        raise RemoteError(f"refusing the remote file name {name!r} (absolute, empty or '..')")
    return name


def parse_manifest(text: bytes) -> list[RemoteFile]:
    """``find -printf 'PART\\tNAME\\tSIZE\\tMTIME\\0'`` records (a name may hold tabs and
    newlines; NUL ends a record)."""
    files = []
    for record in text.split(b"\0"):
        if not record.strip():
            continue
        head, _, rest = record.decode("utf-8", "surrogateescape").partition("\t")
        name, size, mtime = rest.rsplit("\t", 2)
        if head not in (RUN, ROOT, CHECKPOINTS):
            raise RemoteError(f"remote find: unexpected line {record[:80]!r}")
        files.append(RemoteFile(head, check_name(name), int(size), int(float(mtime))))
    return files


def wanted(files: list[RemoteFile], layout: Layout, state: dict) -> list[RemoteFile]:
    """The files to copy: missing here, or changed there (size or whole-second mtime differ
    from both the local file and what the last fetch recorded)."""
    out = []
    for f in files:
        path = layout.local(f)
        try:
            st = path.stat()
        except FileNotFoundError:
            out.append(f)
            continue
        remote = [f.size, f.mtime]
        if [st.st_size, int(st.st_mtime)] != remote and state.get(f.key) != remote:
            out.append(f)
    return out


def batches(files: list[RemoteFile], limit: int = BATCH_BYTES) -> list[list[RemoteFile]]:
    """``files`` in groups of one part each and at most ``limit`` bytes (a larger file alone)."""
    out: list[list[RemoteFile]] = []
    size = 0
    for f in sorted(files, key=lambda f: (f.part, f.name)):
        if not out or out[-1][0].part != f.part or (size + f.size > limit and out[-1]):
            out.append([])
            size = 0
        out[-1].append(f)
        size += f.size
    return out


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return ""
