"""What a job needs, sent by content into a directory of its own on the remote.

:func:`collect` reads what the spec names (and a sweep's or study's base spec): the spec; a
model, loss or data factory FILE.py and the Python code beside it (what it may import); a
package a ``package.module:function`` names; ``train.script`` and its directory;
``train.data.path`` and ``train.eval.data.path``; ``train.pythonpath``; a container image
given as a relative path; the project layer (``.hpcsuite/profile.yaml``, ``templates/``).
Nothing else is sent. A relative path means the submit directory's file and is sent; an
absolute one names the cluster's own file (``/scratch/datasets/...``) and is left as written.

:func:`upload` sends each file's content once: the remote keeps ``WORKDIR/.hpcsuite/objects``,
named by sha256, and a job's directory (``WORKDIR/jobs/LABEL``) is hard links to them, laid out
as the files lie here, so every relative path in the spec means the same file there. The job
directory appears whole or not at all (made under another name, renamed last).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import shlex
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .manifest import human
from .ssh import LOST, Connection, Lost, RemoteError, quote_dir, why

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".tox",
             ".mypy_cache", ".pytest_cache", ".ipynb_checkpoints"}
MAX_FILES = 20_000
USER_FILE = re.compile(r"(?P<file>.+\.py):[A-Za-z_][A-Za-z0-9_]*")
USER_MODULE = re.compile(r"(?P<top>[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)*:"
                         r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Bundle:
    """The files a command needs: each by its path relative to ``root``, the directory the
    remote job directory stands for; ``cwd`` (under ``root``) is the submit directory."""

    cwd: Path
    files: dict[Path, Path] = field(default_factory=dict)     # absolute local path -> itself
    notes: list[str] = field(default_factory=list)
    skip: set[Path] = field(default_factory=set)               # output directories

    @property
    def root(self) -> Path:
        return Path(os.path.commonpath([self.cwd, *self.files])) if self.files else self.cwd

    def relative(self, path: Path) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    def add(self, path: Path, beside: str = "") -> None:
        """``path`` (a file, or a directory and everything under it); ``beside``: with a
        file, also its directory's files ("all") or its directory's Python code ("code")."""
        path = Path(os.path.abspath(path))
        if path.is_file():
            self.files[path] = path
            if beside:
                self._walk(path.parent, code_only=beside == "code")
        elif path.is_dir():
            self._walk(path)

    def _walk(self, top: Path, code_only: bool = False) -> None:
        for here, dirs, names in os.walk(top):
            base = Path(here)
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
                             and (base / d) not in self.skip)
            for name in names:
                p = base / name
                if p.is_file() and not name.endswith((".pyc", ".pyo")) \
                        and (name.endswith(".py") or not code_only):
                    self.files[p] = p
                    if len(self.files) > MAX_FILES:
                        raise UserError(f"{top}: more than {MAX_FILES} files to send; name a "
                                        "smaller directory, or keep large data on the cluster "
                                        "and give its absolute path there")


def _text(data: dict, *keys: str):
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _sets(sets) -> dict[str, str]:
    out = {}
    for item in sets or ():
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value
    return out


def collect(spec: str, sets=(), extra: tuple[str, ...] = ()) -> Bundle:
    """What ``spec`` (a job spec, or a sweep's or study's file and its base spec) and the
    command line's ``extra`` files need, for a submit from the current directory."""
    from ..submit.schema import read_yaml

    bundle = Bundle(cwd=Path.cwd().absolute())
    project = bundle.cwd / ".hpcsuite"
    for name in ("profile.yaml", "templates"):
        if (project / name).exists():
            bundle.add(project / name)
    for item in extra:
        if item:
            bundle.add(Path(item))
    path = Path(spec)
    data = read_yaml(spec)
    bundle.add(path)
    if isinstance(data.get("base"), str) and ("axes" in data or "mode" in data):
        base = path.parent / data["base"]
        bundle.add(base)
        data = read_yaml(str(base)) if base.is_file() else {}
    _job_files(bundle, data, _sets(sets))
    return bundle


def _job_files(bundle: Bundle, data: dict, sets: dict[str, str]) -> None:
    def value(key: str):
        return sets[key] if key in sets else _text(data, *key.split("."))

    output = value("output_dir") or "runs"
    if isinstance(output, str) and not os.path.isabs(output):
        bundle.skip.add(Path(os.path.abspath(bundle.cwd / output)))
    pythonpath = value("train.pythonpath") or []
    if isinstance(pythonpath, str):
        pythonpath = [p.strip(" '\"") for p in pythonpath.strip("[]").split(",")]
    # A script and its directory; a builder, loss or factory and the Python code beside it
    # (what it may import); data, an image: the path itself.
    for key, beside in (("train.model", "code"), ("train.loss", "code"),
                        ("train.data.factory", "code"), ("train.eval.data.factory", "code"),
                        ("train.script", "all"), ("train.data.path", ""),
                        ("train.eval.data.path", ""), ("container.image", "")):
        text = value(key)
        if not isinstance(text, str) or not text:
            continue
        ref = USER_FILE.fullmatch(text)
        module = USER_MODULE.fullmatch(text)
        if ref:
            text = ref["file"]
        elif module and key not in ("train.data.path", "train.eval.data.path"):
            for where in [".", *[p for p in pythonpath if isinstance(p, str)]]:
                for name in (module["top"], module["top"] + ".py"):
                    target = bundle.cwd / where / name
                    if not os.path.isabs(where) and target.exists():
                        bundle.add(target)
            continue
        elif key in ("train.model", "train.loss"):
            continue      # a built-in name
        _named(bundle, key, text, beside)
    for i, entry in enumerate(pythonpath):
        if isinstance(entry, str) and entry:
            _named(bundle, f"train.pythonpath[{i}]", entry, "")


def _named(bundle: Bundle, key: str, text: str, beside: str) -> None:
    if os.path.isabs(text):
        bundle.notes.append(f"{key}: {text} is absolute: the cluster's own path, not sent")
        return
    target = bundle.cwd / text
    if target.exists():
        bundle.add(target, beside=beside)


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Sent:
    """Where the job's files are on the remote and what it cost to put them there."""

    job_dir: str          # absolute, on the remote
    cwd: str              # the submit directory's counterpart there
    workdir: str          # the remote working directory, absolute
    files: int
    total: int
    sent_files: int
    sent_bytes: int

    def line(self, where: str) -> str:
        return (f"sent {self.sent_files} of {self.files} file(s), {human(self.sent_bytes)} of "
                f"{human(self.total)} ({self.files - self.sent_files} already there) to {where}: "
                f"{self.job_dir}")


def _object(path: Path, known: dict | None = None) -> str:
    """The object's name: the content's sha256, ``x`` added for an executable file. ``known``:
    digests already taken, by path, reused while the file's size and mtime are unchanged (as
    rsync's quick check: a large unchanged data file is not read again at every submit)."""
    st = path.stat()
    seen = (known or {}).get(str(path))
    if isinstance(seen, list) and seen[:2] == [st.st_size, st.st_mtime_ns]:
        sha = str(seen[2])
    else:
        sha = digest(path)
        if known is not None:
            known[str(path)] = [st.st_size, st.st_mtime_ns, sha]
    return sha + ("x" if os.access(path, os.X_OK) else "")


KNOWN_MAX = 50_000      # digests kept: the most recently sent files'


def _known_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcsuite" / \
        "sent-digests.json"


def _load_known() -> dict:
    import json

    try:
        data = json.loads(_known_path().read_text())
    except (OSError, ValueError):
        return {}       # none yet, or damaged: every file is read again
    return data if isinstance(data, dict) else {}


def _save_known(known: dict) -> None:
    """The digests, the newest KNOWN_MAX, written whole or not at all (a cache: a failure
    to write it costs the next submit a read of its files, nothing else)."""
    import json

    path = _known_path()
    keep = dict(list(known.items())[-KNOWN_MAX:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, path)
    except OSError:
        pass


class _Checked:
    """A file read into the tar stream, its sha256 taken as it goes: a file that changed
    after it was named by its digest must not be stored under that name."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def upload(conn: Connection, bundle: Bundle, label: str) -> Sent:
    """Send ``bundle``'s files that are not there yet and lay out the job directory."""
    entries = []
    sizes = {}
    known = _load_known()
    for path in sorted(bundle.files):
        rel = bundle.relative(path)
        if any(c in rel for c in "\n\t\0") or rel.startswith("../"):
            raise UserError(f"{path}: a file name hpcsuite cannot send (newline or tab in it)")
        name = _object(path, known)
        known[str(path)] = known.pop(str(path))       # the newest last: kept longest
        sizes[name] = path
        entries.append((name, rel))
    _save_known(known)
    workdir = quote_dir(conn.remote.workdir)
    asked = conn.run(f"mkdir -p {workdir}/.hpcsuite/objects {workdir}/jobs && cd {workdir} && "
                     "pwd -P && while read -r h; do [ -e .hpcsuite/objects/\"$h\" ] || "
                     "echo \"$h\"; done", input="".join(f"{n}\n" for n in sizes).encode())
    if asked.returncode != 0:
        raise RemoteError(f"{conn.where()}: cannot use the working directory "
                          f"{conn.remote.workdir}: {_last(asked.stderr)}")
    lines = asked.stdout.decode().split()
    absolute, missing = lines[0], [h for h in lines[1:] if h in sizes]
    rel_cwd = os.path.relpath(bundle.cwd, bundle.root)
    script = _LAY_OUT.format(workdir=workdir, label=shlex.quote(label))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(conn.argv(script), stdin=subprocess.PIPE, stdout=out, stderr=err)
        refused = None
        try:
            _write_tar(proc.stdin, entries, [(n, sizes[n]) for n in missing])
        except BrokenPipeError:
            pass      # the remote stopped reading: its stderr says why
        except UserError as e:
            refused = e
        finally:
            proc.stdin.close()
        code = proc.wait()
        if refused is not None:
            raise refused
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code == LOST:
        raise Lost(conn.where(), why(stderr.decode(errors="replace")))
    if code != 0:
        raise RemoteError(f"{conn.where()}: sending the job's files failed: "
                          f"{_last(stderr)}; nothing of this job was left there")
    job_dir = stdout.decode().strip().splitlines()[-1]
    cwd = job_dir if rel_cwd == "." else f"{job_dir}/{Path(rel_cwd).as_posix()}"
    return Sent(job_dir, cwd, absolute, len(entries),
                sum(sizes[n].stat().st_size for n, _ in entries), len(missing),
                sum(sizes[n].stat().st_size for n in missing))


def _write_tar(sink, entries, objects) -> None:
    """A tar stream to ``sink``: each object, then the MANIFEST (object, path per line). The
    remote uses nothing of a stream without its MANIFEST, so one cut short (a file that
    changed while it was read, an interrupt) leaves nothing there."""
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        for name, path in objects:
            info = tar.gettarinfo(str(path), arcname=f"objects/{name}")
            info.mode = 0o555 if name.endswith("x") else 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as f:
                checked = _Checked(f)
                tar.addfile(info, checked)
            if checked.h.hexdigest() != name.rstrip("x"):
                raise UserError(f"{path}: changed while it was being sent; nothing of this job "
                                "was kept there: send it again")
        manifest = "".join(f"{n} {rel}\n" for n, rel in entries).encode()
        info = tarfile.TarInfo("MANIFEST")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))


def _last(stderr: bytes) -> str:
    """The remote's last word on why it failed (tar's closing summary is not one)."""
    lines = [line for line in stderr.decode(errors="replace").splitlines()
             if line.strip() and "Exiting with failure status" not in line]
    return lines[-1].strip() if lines else "no reason given"


# Run by sh on the remote, the tar stream on stdin: unpack into a private directory; only a
# stream that ended with its manifest goes on: move the objects into the store (read-only: a
# job that writes to an input cannot change another's), link the job's files, rename the job
# directory into place. Any failure removes both directories (the trap); objects already
# moved are whole files and stay.
_LAY_OUT = """set -e
cd {workdir}
t=$(mktemp -d .hpcsuite/incoming.XXXXXX)
j=$(mktemp -d jobs/.partial.XXXXXX)
trap 'rm -rf "$t" "$j"' EXIT
tar -xf - -C "$t"
[ -f "$t/MANIFEST" ] || {{ echo "the stream ended before its manifest" >&2; exit 3; }}
if [ -d "$t/objects" ]; then
  for f in "$t"/objects/*; do [ -e "$f" ] && mv -f "$f" .hpcsuite/objects/; done
fi
made=
while read -r h p; do
  case $p in */*) d=${{p%/*}} ;; *) d=. ;; esac
  if [ "$d" != "$made" ]; then mkdir -p "$j/$d"; made=$d; fi
  ln ".hpcsuite/objects/$h" "$j/$p" 2>/dev/null || cp -p ".hpcsuite/objects/$h" "$j/$p"
done < "$t/MANIFEST"
chmod 755 "$j"
mv "$j" jobs/{label}
j=
echo "$(pwd -P)/jobs/{label}"
"""


def label_for(spec: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(spec).name.split(".")[0])[:40] or "job"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
