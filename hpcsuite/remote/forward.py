"""A command given ``--remote NAME`` (or ``HPCSUITE_REMOTE``), run on the remote's login node.

The command line is parsed here only as far as forwarding needs: which token is the spec (sent
with what it names, :mod:`.send`, and replaced by its path there) and which are ``--profile``
and ``--template-dir`` (files here, sent too). Everything else goes as typed to the hpcsuite
the site installed, run in the remote working directory, with the run registry kept there
(``HPCSUITE_REGISTRY``) whichever job directory a submit ran in. Its output and exit status
are the command's.

``submit --wait`` is two steps: the submit (the job id comes back), then ``status JOB --wait``
over the connection. A lost connection ends only the second: the job keeps running, the
connection is tried again for a minute, and if it does not come back the one line says how to
follow the job again.
"""

from __future__ import annotations

import json
import sys
import time

import click

from .. import __version__
from ..errors import UserError
from . import config
from .ssh import Connection, Lost, RemoteError

# The commands that talk to Slurm, and with a second word those of a group that do.
RUNS_THERE = {"submit", "render", "lint", "doctor", "status", "logs", "runs", "report", "cancel"}
GROUPS_THERE = {"sweep": {"run", "status", "report", "resubmit"},
                "study": {"run", "status", "report", "rerun"},
                "bench": {"allreduce"}}
# Those whose first argument is a spec here (sent, with what it names); SENDS: those whose
# --profile and --template-dir are files here too (sent, and named by their path there).
TAKES_SPEC = {("submit",), ("render",), ("lint",), ("doctor",), ("sweep", "run"), ("study", "run")}
SENDS = TAKES_SPEC | {("sweep", "resubmit"), ("study", "rerun"), ("bench", "allreduce")}
RECONNECT_S = 60


def commands_help() -> str:
    groups = [f"{g} {s}" for g, subs in GROUPS_THERE.items() for s in sorted(subs)]
    return ", ".join(sorted(RUNS_THERE) + groups)


def requested(args: list[str]) -> tuple[str | None, list[str]]:
    """(the remote ``args`` name with --remote, or None; ``args`` without it)."""
    out, name, i = [], None, 0
    while i < len(args):
        token = args[i]
        if token == "--":
            out += args[i:]
            break
        if token == "--remote":
            if i + 1 >= len(args):
                raise UserError("--remote needs the name of a remote (remotes.yaml)")
            name, i = args[i + 1], i + 2
            continue
        if token.startswith("--remote="):
            name = token.split("=", 1)[1]
        else:
            out.append(token)
        i += 1
    return name, out


def words_of(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the command's words, e.g. ("sweep", "run"), the tokens after them), the main group's
    own options (-v) skipped."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    if i == len(args):
        return (), []
    words, i = [args[i]], i + 1
    if words[0] in GROUPS_THERE and i < len(args) and not args[i].startswith("-"):
        words.append(args[i])
        i += 1
    return tuple(words), args[i:]


def wanted(args: list[str], exists=None) -> tuple[str, tuple[str, ...], list[str]] | None:
    """(remote name, command words, their tokens) when ``args`` is to run on a remote.
    ``exists(words)``: whether hpcsuite has that command (a typo is click's to report)."""
    import os

    name, stripped = requested(args)
    words, rest = words_of(stripped)
    if not words or words[0] == "fetch" or (exists is not None and not exists(words)):
        return None
    if name is None and (words[0] in RUNS_THERE or words[0] in GROUPS_THERE):
        name = os.environ.get(config.ENV) or None
    if name is None or "--help" in rest or "-h" in rest:
        return None
    there = words[0] in RUNS_THERE or (words[0] in GROUPS_THERE and len(words) > 1
                                        and words[1] in GROUPS_THERE[words[0]])
    if not there:
        raise UserError(f"hpcsuite {' '.join(words)} runs here only; --remote is for "
                        f"{commands_help()} (and `hpcsuite fetch`)")
    return name, words, rest


class Tokens:
    """A command's tokens, with where its positional arguments and option values are."""

    def __init__(self, command: click.Command, tokens: list[str]):
        self.tokens = list(tokens)
        valued = {o for p in command.params if isinstance(p, click.Option)
                  and not p.is_flag and not p.count for o in p.opts}
        self.positional: list[int] = []
        self.values: dict[str, list[int]] = {}
        i = 0
        while i < len(self.tokens):
            t = self.tokens[i]
            if t == "--":
                self.positional += range(i + 1, len(self.tokens))
                break
            if t.startswith("--") and "=" in t:
                self.values.setdefault(t.split("=", 1)[0], []).append(-i - 1)   # inline
            elif t in valued:
                self.values.setdefault(t, []).append(i + 1)
                i += 1
            elif not t.startswith("-") or t == "-":
                self.positional.append(i)
            i += 1

    def value(self, option: str) -> str | None:
        found = self.get(option)
        return found[-1] if found else None

    def get(self, option: str) -> list[str]:
        return [self._at(i) for i in self.values.get(option, []) if self._at(i) is not None]

    def _at(self, i: int) -> str | None:
        if i < 0:
            return self.tokens[-i - 1].split("=", 1)[1]
        return self.tokens[i] if i < len(self.tokens) else None

    def replace(self, option: str, mapping) -> None:
        for i in self.values.get(option, []):
            if i < 0:
                head, value = self.tokens[-i - 1].split("=", 1)
                self.tokens[-i - 1] = f"{head}={mapping(value)}"
            elif i < len(self.tokens):
                self.tokens[i] = mapping(self.tokens[i])

    def drop(self, option: str, flag: bool = False) -> None:
        keep = []
        skip = False
        for i, t in enumerate(self.tokens):
            if skip:
                skip = False
                continue
            if t == option:
                skip = not flag
                continue
            if t.startswith(option + "="):
                continue
            keep.append(t)
        self.tokens = keep


def check_version(conn: Connection) -> str:
    """The remote working directory's absolute path, once the remote's hpcsuite is known to
    be this one's version; else one line naming both and what to do. Asked once per master
    connection (its pid remembered beside its socket): a site that upgrades hpcsuite is seen
    when the connection is next opened, at most ``persist`` seconds after the last command."""
    from .ssh import quote_dir

    known = f"{conn.master} {__version__} {conn.remote.workdir} {conn.remote.command}\n"
    try:
        said = conn.remembered().read_text()
    except OSError:
        said = ""
    if conn.master is not None and said.startswith(known):
        return said[len(known):].strip()    # asked over this very connection already
    workdir = quote_dir(conn.remote.workdir)
    done = conn.run(f"mkdir -p {workdir} && cd {workdir} && pwd -P || exit 97; "
                    f"{conn.hpcsuite(['--version'])}")
    out = done.stdout.decode(errors="replace").split("\n")
    err = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
    if done.returncode == 97:
        raise RemoteError(f"{conn.where()}: cannot use the working directory "
                          f"{conn.remote.workdir}: {err[-1] if err else 'no reason given'}")
    theirs = next((line.rsplit(" ", 1)[-1] for line in reversed(out)
                   if line.startswith("hpcsuite") and "version" in line), None)
    if done.returncode != 0 or theirs is None:
        said = err[-1].strip() if err else f"exit {done.returncode}"
        raise RemoteError(f"{conn.where()}: no hpcsuite there (`{conn.remote.command} --version`: "
                          f"{said}): install hpcsuite {__version__} there (docs/admin/install.md) "
                          f"or set {conn.remote.name}.command in {config.path()}")
    if theirs != __version__:
        raise RemoteError(f"{conn.where()} runs hpcsuite {theirs}, this is hpcsuite "
                          f"{__version__}: install {__version__} there, or "
                          f"`pip install hpcsuite=={theirs}` here")
    if conn.master is not None or conn.is_open():
        conn.remembered().write_text(f"{conn.master} {__version__} {conn.remote.workdir} "
                                     f"{conn.remote.command}\n{out[0].strip()}\n")
    return out[0].strip()


def run(ctx: click.Context, name: str, words: tuple[str, ...], rest: list[str]) -> int:
    """Run ``hpcsuite WORDS REST`` on the remote ``name``; its exit status."""
    remote = config.load(name)
    conn = Connection(remote)
    conn.open()
    workdir = check_version(conn)
    command = _command(ctx, words)
    tokens = Tokens(command, rest)
    cwd = None
    if words in SENDS:
        cwd = _send(conn, words, tokens)
    if words == ("submit",) and "--wait" in tokens.tokens and "--dry-run" not in tokens.tokens:
        return _submit_and_follow(conn, tokens, cwd, workdir)
    line = conn.in_workdir(conn.hpcsuite([*words, *tokens.tokens]), cwd=cwd, registry=workdir)
    try:
        return conn.run(line, capture=False, tty=_terminal()).returncode
    except Lost as e:
        raise RemoteError(f"{e.where}: lost the connection during `hpcsuite {' '.join(words)}` "
                          f"({e.reason}); {_after_loss(words, remote.name)}") from None


def _after_loss(words: tuple[str, ...], name: str) -> str:
    """What to do after the connection was lost during ``words``: a command that changes
    something may have done it, so it is looked at before it is run again."""
    look = f"`hpcsuite runs --remote {name}`"
    return {
        ("submit",): f"the job may have been submitted: {look} shows it before you submit again",
        ("cancel",): f"the job may have been cancelled: `hpcsuite status JOB --remote {name}` "
                     "says",
        ("sweep", "run"): f"the array may have been submitted and goes on: {look} shows it "
                          "before you run the sweep again",
        ("sweep", "resubmit"): f"the element may have been submitted: {look} shows it",
        ("study", "run"): "what was submitted goes on: `hpcsuite study run STUDY_DIR --remote "
                          f"{name}` picks up where it left off",
        ("study", "rerun"): f"the rerun may have been submitted: {look} shows it, and "
                            f"`hpcsuite study run DIR --remote {name}` goes on with its directory",
        ("bench", "allreduce"): f"the benchmark's job may have been submitted: {look} shows it",
    }.get(words, "nothing was changed there by it: run it again")


def _command(ctx: click.Context, words: tuple[str, ...]) -> click.Command:
    command = ctx.command
    for word in words:
        command = command.get_command(ctx, word)
        if command is None:
            raise click.UsageError(f"no such command: {' '.join(words)}")
    return command


def _send(conn: Connection, words: tuple[str, ...], tokens: Tokens) -> str | None:
    """Send what the command's spec names; its tokens then name the files there. The remote
    directory the command runs in."""
    from pathlib import Path

    from . import send

    spec = tokens.tokens[tokens.positional[0]] \
        if tokens.positional and words in TAKES_SPEC else None
    if spec is not None and not Path(spec).is_file():
        if words == ("study", "run") or words == ("sweep", "run"):
            return None     # a study directory there, to go on with
        raise UserError(f"{spec}: no such file here (with --remote the spec is this machine's)")
    profile, template_dir = tokens.value("--profile"), tokens.value("--template-dir")
    for given in (profile, template_dir):
        if given and not Path(given).exists():
            raise UserError(f"{given}: no such file or directory")
    bundle = send.collect(spec, tokens.get("--set"), (profile, template_dir)) if spec else \
        send.Bundle(cwd=Path.cwd().absolute())
    if not spec:
        for given in (profile, template_dir):
            if given:
                bundle.add(Path(given))
    for note in bundle.notes:
        click.echo(f"note: {spec}: {note}", err=True)
    if not bundle.files:
        return None
    sent = send.upload(conn, bundle, send.label_for(spec or "doctor"))
    click.echo(sent.line(conn.where()), err=True)

    def there(path: str) -> str:
        return f"{sent.job_dir}/{bundle.relative(Path(path).absolute())}"

    if spec:
        tokens.tokens[tokens.positional[0]] = there(spec)
    tokens.replace("--profile", there)
    tokens.replace("--template-dir", there)
    return sent.cwd


def _submit_and_follow(conn: Connection, tokens: Tokens, cwd: str | None, workdir: str) -> int:
    """``submit --wait``: submit (the job id back), then follow it over the connection."""
    as_json = "--json" in tokens.tokens
    timeout = tokens.value("--timeout")
    tokens.drop("--wait", flag=True)
    tokens.drop("--timeout")
    tokens.drop("--json", flag=True)
    line = conn.in_workdir(conn.hpcsuite(["submit", *tokens.tokens, "--json"]), cwd=cwd,
                           registry=workdir)
    done = _submitted(conn, line)
    if done.returncode != 0:
        return done.returncode
    try:
        submitted = json.loads(done.stdout)
        job_id = str(submitted["job_id"])
    except (ValueError, KeyError, TypeError):
        raise RemoteError(f"{conn.where()}: `hpcsuite submit --json` said "
                          f"{done.stdout[:200]!r}, not a job id") from None
    if not as_json:
        click.echo(f"submitted job {job_id}; run directory {submitted.get('run_dir')} on "
                   f"{conn.where()}")
    return follow(conn, job_id, workdir, float(timeout) if timeout else None, as_json)


def _submitted(conn: Connection, line: str):
    """The remote submit ``line``: its stdout (the JSON) captured, its stderr shown as it
    comes (warnings, notes, an error)."""
    import subprocess

    done = subprocess.run(conn.argv(line), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          text=True)
    if done.returncode == 255:
        raise RemoteError(f"{conn.where()}: lost the connection during `hpcsuite submit`; "
                          f"{_after_loss(('submit',), conn.remote.name)}")
    return done


def follow(conn: Connection, job_id: str, workdir: str, timeout: float | None,
           as_json: bool) -> int:
    """``status JOB --wait`` there until it ends; a lost connection tried again for a minute."""
    t0 = time.monotonic()
    tty = _terminal() and not as_json
    again = f"`hpcsuite status {job_id} --wait --remote {conn.remote.name}`"
    while True:
        args = ["status", job_id, "--wait"] + (["--json"] if as_json else [])
        if timeout is not None:
            left = timeout - (time.monotonic() - t0)
            args += ["--timeout", f"{max(left, 0.0):.0f}"]
        try:
            return conn.run(conn.in_workdir(conn.hpcsuite(args), registry=workdir),
                            capture=False, tty=tty).returncode
        except Lost as e:
            click.echo(f"\nnote: lost the connection to {conn.where()} ({e.reason}); job "
                       f"{job_id} keeps running; connecting again", err=True)
            if not _reconnect(conn):
                raise RemoteError(f"{conn.where()}: the connection did not come back in "
                                  f"{RECONNECT_S} s; job {job_id} keeps running there: {again} "
                                  "follows it again") from None


def _terminal() -> bool:
    """Whether the command runs on a terminal (stdin, stdout and stderr): then the remote gets
    one too (ssh -tt), so a live line is drawn and Ctrl-C reaches the command there; its
    stdout and stderr then arrive as one stream, which here is one terminal anyway."""
    return all(stream.isatty() for stream in (sys.stdin, sys.stdout, sys.stderr))


def _reconnect(conn: Connection) -> bool:
    deadline = time.monotonic() + RECONNECT_S
    while time.monotonic() < deadline:
        try:
            conn.open()
            return True
        except RemoteError:
            time.sleep(5)
    return False
