"""`hpcsuite fetch RUN --remote NAME`: a run's directory brought back from the remote.

What comes back, into the local runs/ layout (``DEST/NAME/JOBID`` mirrors the remote
``OUTPUT_DIR/NAME/JOBID``, :mod:`hpcsuite.runs.rundir`)::

    DEST/NAME/JOBID/...            every regular file of the run directory (results, attempts,
                                   logs, plots, reports, mlflow.json, ...); symlinks are not
                                   followed
    DEST/NAME/slurm-JOBID.out      Slurm's log of the batch script, from the run root
    DEST/NAME/mlruns/EXP/...       the run's own MLflow run (and its experiment's meta.yaml)
                                   when mlflow.json says it logged to the job name's file store
    DEST/NAME/checkpoints/...      only with ``checkpoints=True``: the run root's checkpoints/,
                                   or train.checkpoint.dir of the run's job.json (committed and
                                   half-made saves alike, but never .tmp-*/.trash-* ones)

A tracked run's copy points at the copy: its mlflow.json's store and the MLflow file store's
meta.yaml artifact locations name the local store, so ``report`` and ``tracking sync`` read
the laptop's files, not a path that exists only on the cluster. A store elsewhere (a tracking
server, a spec's own path) is left as mlflow.json names it.

Resumable: one remote ``find`` lists the files with their size and mtime; only those missing
here or changed there are copied, by ``tar`` over ssh in batches of about :data:`BATCH_BYTES`
into a staging directory inside DEST, each batch renamed into place once its stream ended
whole. An interrupted fetch keeps every finished batch; the staging directory goes with any
failure. ``.fetched.json`` in the local run directory keeps the remote size and mtime of each
file as copied (a rewritten file differs from the remote's, and must not be copied again).

The local side reads the stream with Python's tarfile (filter ``data``: no links, devices,
absolute names or ``..``), not the system's tar: the laptop may have BSD tar, and each member
is checked against the list asked for before anything is written.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import UserError
from ..runs import rundir
from .manifest import (_ID, CHECKPOINTS, ROOT, RUN, STATE, Layout, RemoteFile, batches,
                       check_component, human, parse_manifest, wanted)
from .ssh import Connection, Lost, RemoteError, why

log = logging.getLogger(__name__)

TAR_OK = (0, 1)            # GNU tar's 1: a file changed while it was read (the next fetch re-copies it)


# ------------------------------------------------------------------- the remote side
@dataclass
class Source:
    """The run there: its directory, root, id, name, and the other directories fetched."""
    run_dir: str
    job_id: str
    name: str
    checkpoints: str | None = None
    slurm: dict | None = None        # what the remote's `status --json` said of the job
    mlruns: list[str] = field(default_factory=list)   # ROOT-relative: its experiment, its run
    store: str | None = None                          # the remote MLflow file store, if local-able

    @property
    def root(self) -> str:
        return str(PurePosixPath(self.run_dir).parent)

    def bases(self) -> dict[str, str]:
        out = {RUN: self.run_dir, ROOT: self.root}
        if self.checkpoints:
            out[CHECKPOINTS] = self.checkpoints
        return out


def _run(conn: Connection, script: str, what: str) -> bytes:
    done = conn.run(script)
    if done.returncode != 0:
        raise RemoteError(f"{conn.where()}: {what}: {_said(done.stderr)}")
    return done.stdout


def _said(stderr: bytes) -> str:
    """The remote's own ``error:`` line when it printed one, else its last line."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    line = errors[-1][len("error:"):].strip() if errors else (lines[-1] if lines else "failed")
    return line


# What the copy keeps of the remote `status --json`: the job as that Slurm saw it.
SLURM_KEYS = ("state", "exit_code", "elapsed", "restarts", "max_rss", "reason")


def resolve(conn: Connection, run: str) -> Source:
    """RUN there: an absolute path is the run directory; else the remote `status --json`,
    run in the remote workdir with its registry."""
    if run.startswith("/"):
        path = str(PurePosixPath(run))
        return Source(path, check_component(PurePosixPath(path).name, "the run directory"),
                      check_component(PurePosixPath(path).parent.name, "the job name"))
    workdir = _run(conn, conn.in_workdir("pwd -P"), "the workdir").decode().strip()
    text = _run(conn, conn.in_workdir(conn.hpcsuite(["status", run, "--json"]), registry=workdir),
                f"hpcsuite status {run}")
    try:
        said = json.loads(text)
        job_id, name, run_dir = str(said["job_id"]), said.get("name"), said.get("run_dir")
    except (ValueError, KeyError, TypeError):
        raise RemoteError(f"{conn.where()}: hpcsuite status {run}: not the JSON it prints") from None
    if not run_dir:
        raise RemoteError(f"{conn.where()}: job {job_id}: no run directory known there")
    run_dir = str(PurePosixPath(workdir) / run_dir)     # a relative one is the workdir's
    return Source(run_dir, check_component(PurePosixPath(run_dir).name, "the run directory"),
                  check_component(name or PurePosixPath(run_dir).parent.name, "the job name"),
                  slurm={k: said.get(k) for k in SLURM_KEYS})


def read_meta(conn: Connection, source: Source, checkpoints: bool) -> None:
    """job.json (train.checkpoint.dir) and mlflow.json of the run there, one call."""
    q = shlex.quote(source.run_dir)
    text = _run(conn, f"cd {q} && for f in {rundir.JOB} {rundir.MLFLOW}; do "
                      "cat -- \"$f\" 2>/dev/null; printf '\\0'; done", "reading the run directory")
    parts = (text.split(b"\0") + [b"", b""])[:2]
    job, mlflow = (_json(p) for p in parts)
    if checkpoints:
        chosen = ((job.get("train") or {}).get("checkpoint") or {}).get("dir")
        source.checkpoints = str(PurePosixPath(source.root) / chosen) if chosen \
            else f"{source.root}/{rundir.CHECKPOINTS}"
    store = _file_store(mlflow.get("uri"))
    exp, run_id = str(mlflow.get("experiment_id", "")), str(mlflow.get("run_id", ""))
    if store == f"{source.root}/{rundir.MLRUNS}" and _ID.fullmatch(exp) and _ID.fullmatch(run_id):
        source.mlruns = [f"{rundir.MLRUNS}/{exp}", f"{rundir.MLRUNS}/{exp}/{run_id}"]
        source.store = store
    elif store == f"{source.run_dir}/{rundir.MLRUNS}":
        source.store = store                       # the fallback store: in the run directory


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _file_store(uri) -> str | None:
    """The directory of a file store (file: URI or plain path), None for a server."""
    if not isinstance(uri, str) or not uri:
        return None
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        return str(PurePosixPath(unquote(urlsplit(uri).path)))
    return str(PurePosixPath(uri)) if uri.startswith("/") else None


def manifest_script(source: Source) -> str:
    """One shell line listing every file to fetch, ``PART\\tNAME\\tSIZE\\tMTIME\\0`` each:
    the run directory must be there, the others are listed when they are."""
    def find(part: str, base: str, prefix: str = "", extra: str = "") -> str:
        fmt = shlex.quote(f"{part}\t{prefix.replace('%', '%%')}%P\t%s\t%T@\\0")
        return f"(cd {shlex.quote(base)} && find . {extra} -type f -printf {fmt})"

    def optional(path: str, step: str) -> str:
        return f"{{ [ ! -d {shlex.quote(path)} ] || {step}; }}"

    log_name = rundir.SLURM_LOG.format(job_id=source.job_id)
    steps = [find(RUN, source.run_dir, extra=f"! -path {shlex.quote('./' + STATE)}"),
             find(ROOT, source.root, extra=f"-maxdepth 1 -name {shlex.quote(log_name)}")]
    if source.mlruns:
        experiment, run = source.mlruns
        steps.append(optional(f"{source.root}/{experiment}", find(
            ROOT, f"{source.root}/{experiment}", f"{experiment}/", "-maxdepth 1 -name meta.yaml")))
        steps.append(optional(f"{source.root}/{run}",
                              find(ROOT, f"{source.root}/{run}", f"{run}/")))
    if source.checkpoints:
        prune = r"\( -name '.tmp-*' -o -name '.trash-*' \) -prune -o"
        steps.append(optional(source.checkpoints, find(CHECKPOINTS, source.checkpoints,
                                                       extra=prune)))
    return " && ".join(steps)


# ------------------------------------------------------------------- the copy
@dataclass
class Fetched:
    """One fetch: where the copy is, and what this fetch copied."""
    remote: str
    remote_run_dir: str
    job_id: str
    name: str
    run_dir: str
    files: int = 0            # in the manifest
    copied: int = 0
    bytes: int = 0
    already: int = 0
    recorded: bool = False    # a new line in the local registry
    slurm: dict | None = None  # what the remote's Slurm said of the job

    def line(self) -> str:
        return f"fetched {self.copied} files ({human(self.bytes)}) of {self.files}; " \
               f"{self.already} already here"

    def to_json(self) -> dict:
        return dict(self.__dict__)


def fetch(conn: Connection, run: str, dest: Path, checkpoints: bool = False,
          workdir: Path | None = None) -> Fetched:
    """RUN copied from the remote into ``dest`` (see the module's doc), recorded once in the
    registry of ``workdir`` (here by default)."""
    from .forward import check_version

    conn.open()
    check_version(conn)
    source = resolve(conn, run)
    read_meta(conn, source, checkpoints)
    files = parse_manifest(_run(conn, manifest_script(source), "listing the run's files"))
    layout = Layout(Path(dest).absolute(), source.name, source.job_id)
    state = _read_state(layout.state)
    todo = wanted(files, layout, state)
    done = Fetched(conn.remote.name, source.run_dir, source.job_id, source.name,
                   str(layout.run_dir), files=len(files), already=len(files) - len(todo),
                   slurm=source.slurm)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        for batch in batches(todo):
            got = _copy_batch(conn, source, layout, batch)
            state.update(got)
            _write_state(layout.state, state)
            done.copied += len(got)
            done.bytes += sum(size for size, _ in got.values())
        if source.mlruns:
            # MLflow's file store knows a run by its directories, empty ones too, which the
            # listing of files leaves out: without artifacts/ the copy is "not found"
            for sub in ("artifacts", "metrics", "params", "tags"):
                (layout.base(ROOT) / source.mlruns[1] / sub).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"{layout.dest}: no space left on the device ({done.copied} files "
                            "copied; fetch again once there is room)") from None
        raise
    finally:
        shutil.rmtree(layout.staging, ignore_errors=True)
        _drop_if_empty(layout.run_dir, layout.root.path)
    done.recorded = _record(workdir or Path.cwd(), done)
    return done


def _copy_batch(conn: Connection, source: Source, layout: Layout,
                batch: list[RemoteFile]) -> dict[str, list[int]]:
    """One tar stream of ``batch`` into the staging directory, then each file renamed into
    place; {key: [size, mtime]} of what arrived (a file gone there meanwhile does not)."""
    part = batch[0].part
    by_name = {f"./{f.name}": f for f in batch}
    staging = layout.staging / part
    shutil.rmtree(layout.staging, ignore_errors=True)
    staging.mkdir(parents=True)
    script = f"tar -C {shlex.quote(source.bases()[part])} --null --no-recursion " \
             "--ignore-failed-read -T - -cf -"
    arrived = {}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(conn.argv(script), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
        feeder = threading.Thread(target=_feed, args=(proc.stdin, list(by_name)), daemon=True)
        feeder.start()
        try:
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as stream:
                    for member in stream:
                        f = by_name.get(member.name)
                        if f is None or not member.isreg():
                            raise RemoteError(f"{conn.where()}: tar sent {member.name!r}, "
                                              "which was not asked for")
                        stream.extract(member, staging, filter="data")
                        arrived[f.key] = (f, member)
            except tarfile.TarError as e:
                proc.wait()
                _tar_failed(conn, proc.returncode, err)
                raise RemoteError(f"{conn.where()}: the tar stream broke off ({e})") from None
            proc.stdout.read()
            proc.wait()
            _tar_failed(conn, proc.returncode, err)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            feeder.join(timeout=5)
    out = {}
    for key, (f, member) in arrived.items():
        staged, final = staging / f.name, layout.local(f)
        if source.store:
            _point_at_copy(staged, f, source, layout, member.mtime)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, final)
        out[key] = [member.size, int(member.mtime)]
    return out


def _feed(pipe, names: list[str]) -> None:
    try:
        pipe.write(b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in names))
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass       # tar went away: its exit says why


def _tar_failed(conn: Connection, code: int, err) -> None:
    if code in TAR_OK:
        return
    err.seek(0)
    text = err.read().decode(errors="replace")
    if code == 255:
        raise Lost(conn.where(), why(text))
    raise RemoteError(f"{conn.where()}: tar: {_said(text.encode())} (exit {code})")


def _point_at_copy(path: Path, f: RemoteFile, source: Source, layout: Layout,
                   mtime: float) -> None:
    """mlflow.json and the file store's meta.yaml name the remote store: make them name the
    copy (the remote's mtime kept)."""
    if not ((f.part == RUN and f.name == rundir.MLFLOW) or
            (f.name.endswith("/meta.yaml") and f.name.startswith(rundir.MLRUNS + "/"))):
        return
    there = source.store
    here = str(layout.run_dir / rundir.MLRUNS) if there == f"{source.run_dir}/{rundir.MLRUNS}" \
        else str(layout.root.path / rundir.MLRUNS)
    text = path.read_text(errors="surrogateescape")
    new = text.replace(PurePosixPath(there).as_uri(), Path(here).as_uri()).replace(there, here)
    if new != text:
        path.write_text(new, errors="surrogateescape")
        os.utime(path, (mtime, mtime))


def _drop_if_empty(*paths: Path) -> None:
    """A fetch that copied nothing leaves no empty directory behind."""
    for path in paths:
        try:
            path.rmdir()
        except OSError:
            return


def _read_state(path: Path) -> dict:
    value = _json(path.read_bytes()) if path.is_file() else {}
    return {k: v for k, v in value.items() if isinstance(v, list) and len(v) == 2}


def _write_state(path: Path, state: dict) -> None:
    from ..runs.results import write_json_atomic

    write_json_atomic(path, state)


def _record(workdir: Path, done: Fetched) -> bool:
    """The copy in the local registry: once per job id fetched from that remote, and again
    when what its Slurm says of the job has changed (`status` reads the latest line)."""
    from ..runs import registry

    for entry in reversed(registry.load(workdir)):
        if entry["job_id"] == done.job_id and entry.get("remote") == done.remote:
            if done.slurm is None or entry.get("slurm") == done.slurm:
                return False
            break
    registry.record(workdir, {"job_id": done.job_id, "name": done.name, "run_dir": done.run_dir,
                              "remote": done.remote, "remote_run_dir": done.remote_run_dir,
                              **({"slurm": done.slurm} if done.slurm else {})})
    return True
