"""The system's OpenSSH client, one shared connection per remote.

hpcsuite never reads, stores or prompts for a password or a key: ``ssh`` does all of it, with
the user's ``~/.ssh/config`` (Host aliases, ProxyJump, IdentityFile, agents, certificates) and
host keys checked as ``ssh`` checks them. The first command opens a master connection
(ControlMaster) that stays ControlPersist seconds after the last one, so a site that asks for a
second factor asks once; its socket lives in a directory only the user can enter (mode 700).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import UserError
from .config import Remote

LOST = 255            # ssh's own exit status: the connection failed or was lost
OPEN_TIMEOUT = 120    # seconds to open the master without a terminal to answer prompts on
SOCKET_DIR_MAX = 50   # the directory's length: its socket's name adds 50 (KEY-%C), the limit is 104


class RemoteError(UserError):
    """Something between here and the remote went wrong (exit 2, one line)."""


def socket_dir() -> Path:
    """The directory of the control sockets, made mode 700 and refused when others can enter
    it (a socket there would let them use the connection)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(base) / "hpcsuite" if base else Path.home() / ".cache" / "hpcsuite"
    path = root / "ssh"
    if len(str(path)) > SOCKET_DIR_MAX:        # a socket's path is at most ~104 bytes
        path = Path(tempfile.gettempdir()) / f"hpcsuite-ssh-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise UserError(f"{path}: owned by another user; hpcsuite keeps its SSH control sockets "
                        "there (remove it or set XDG_RUNTIME_DIR)")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def quote_dir(path: str) -> str:
    """``path`` for a remote shell: quoted, but a leading ``~/`` left for the shell to expand."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def why(stderr: str) -> str:
    """The line of ssh's stderr that says why it failed (through a jump host the last line is
    often only "Connection closed")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    telling = ("Permission denied", "Connection refused", "Could not resolve", "timed out",
               "Host key verification failed", "No route to host", "open failed",
               "REMOTE HOST IDENTIFICATION HAS CHANGED", "Network is unreachable",
               "Connection reset", "no such identity", "Too many authentication failures")
    for line in lines:
        if any(t in line for t in telling):
            return line
    return lines[-1] if lines else "ssh failed without saying why"


class Connection:
    """``ssh`` to one remote, over its shared master connection."""

    def __init__(self, remote: Remote):
        self.remote = remote
        # One master per remote entry: two entries reaching the same host with other keys or
        # options (%C alone hashes host, port and user) must not share a connection.
        import hashlib

        entry = "\0".join([remote.name, remote.host, *remote.ssh_options]).encode()
        self.key = hashlib.sha256(entry).hexdigest()[:8]
        self.control = str(socket_dir() / f"{self.key}-%C")
        self.master = None      # the master connection's pid, once known

    def _base(self) -> list[str]:
        return ["ssh", "-o", f"ControlPath={self.control}", *self.remote.ssh_options]

    def where(self) -> str:
        return f"remote {self.remote.name} ({self.remote.host})"

    def is_open(self) -> bool:
        done = subprocess.run([*self._base(), "-O", "check", "--", self.remote.host],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        said = done.stderr.decode(errors="replace")     # "Master running (pid=N)"
        if done.returncode == 0 and "pid=" in said:
            self.master = said.split("pid=", 1)[1].split(")", 1)[0]
        return done.returncode == 0

    def remembered(self) -> Path:
        """Where what this master connection found out is kept (the version check's answer):
        asked again when the connection is another."""
        return socket_dir() / f"{self.key}.checked"

    def open(self) -> None:
        """Make sure the master connection is up: open it (ssh asks for what it needs on the
        terminal, once) or say in one line why it cannot be."""
        if self.is_open():
            return
        argv = [*self._base(), "-o", "ControlMaster=auto",
                "-o", f"ControlPersist={self.remote.persist}", "-f", "-N", "--", self.remote.host]
        # stderr to a file, never a pipe: a backgrounded ssh would hold a pipe open
        with tempfile.TemporaryFile("w+") as err:
            try:
                done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err,
                                      timeout=None if sys.stdin.isatty() else OPEN_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise RemoteError(f"{self.where()}: no connection after {OPEN_TIMEOUT} s") from None
            except FileNotFoundError:
                raise UserError("ssh: not found on PATH; --remote runs the system's OpenSSH "
                                "client (Debian: apt-get install openssh-client)") from None
            err.seek(0)
            text = err.read()
        if done.returncode != 0:
            raise RemoteError(f"{self.where()}: {why(text)}")

    def close(self) -> None:
        subprocess.run([*self._base(), "-O", "exit", "--", self.remote.host],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)

    def argv(self, script: str, tty: bool = False) -> list[str]:
        """The ssh command line that runs ``script`` (a POSIX shell line) on the remote."""
        return [*self._base(), "-o", "ControlMaster=no", *(["-tt"] if tty else ["-T"]), "--",
                self.remote.host, script]

    def run(self, script: str, *, input: bytes | None = None, capture: bool = True,
            tty: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run ``script`` there; ``capture``: its stdout and stderr as bytes, else the
        terminal's. A lost connection (ssh's 255) is one line naming the remote."""
        out = subprocess.PIPE if capture else None
        stdin = subprocess.PIPE if input is not None else (None if tty else subprocess.DEVNULL)
        done = subprocess.run(self.argv(script, tty), input=input, stdout=out, stderr=out,
                              stdin=None if input is not None else stdin, timeout=timeout)
        if done.returncode == LOST:
            raise Lost(self.where(), why((done.stderr or b"").decode(errors="replace")))
        return done

    def in_workdir(self, line: str, cwd: str | None = None, registry: str | None = None) -> str:
        """``line`` as it runs in the remote working directory (made if missing), or in
        ``cwd``, with the run registry kept at ``registry``."""
        workdir = quote_dir(self.remote.workdir)
        go = f"mkdir -p {workdir} && cd {workdir}"
        if cwd:
            go += f" && cd {shlex.quote(cwd)}"
        if registry:
            go += f" && HPCSUITE_REGISTRY={shlex.quote(registry)} && export HPCSUITE_REGISTRY"
        return f"{go} && {line}"

    def hpcsuite(self, args: list[str]) -> str:
        """The remote's hpcsuite command line with ``args``."""
        return f"{self.remote.command} {' '.join(shlex.quote(a) for a in args)}".rstrip()


class Lost(RemoteError):
    """ssh exited 255: the connection could not be made, or was lost."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")
