"""``remotes.yaml``: each remote a user sends work to, named once.

::

    # ~/.config/hpcsuite/remotes.yaml
    mycluster:
      host: login.mycluster.org        # the SSH destination, as `ssh` understands it
      workdir: ~/hpcsuite              # on the remote: jobs/, objects and the run registry
      command: module load hpcsuite && hpcsuite   # how hpcsuite is called there
      # ssh_options: [-F, ~/.ssh/config.mycluster]   # extra arguments for ssh, rarely needed
      # persist: 600                   # seconds the shared connection stays open when idle

The file is read with the job spec's strict YAML: a mistake is one line naming the file and
the key.
"""

from __future__ import annotations

import os
from dataclasses import field
from pathlib import Path

from ..errors import ConfigError, UserError, close_match
from ..records import Record, meta, record
from ..submit.schema import convert, read_yaml

FILENAME = "remotes.yaml"
ENV = "HPCSUITE_REMOTE"
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


def _destination_problem(value: str) -> str | None:
    if value.startswith("-"):
        return "an SSH destination may not start with '-' (ssh would read it as an option)"
    if any(c.isspace() for c in value):
        return "an SSH destination has no spaces: a Host alias, host, user@host or ssh://..."
    return None


@record
class Entry(Record):
    """One remote as remotes.yaml writes it: where it is, where hpcsuite works there and how
    it is called."""

    host: str = field(metadata=meta(
        "the SSH destination as `ssh` understands it: a Host alias of ~/.ssh/config, host, "
        "user@host or ssh://user@host:port", nonempty=True, check=_destination_problem))
    workdir: str = field(default="~/hpcsuite", metadata=meta(
        "the remote working directory (~ is the remote home): jobs/ holds one directory per "
        "submitted job, .hpcsuite/ the objects already sent and the run registry",
        nonempty=True))
    command: str = field(default="hpcsuite", metadata=meta(
        "how hpcsuite is called there, as a shell command line (e.g. `module load hpcsuite && "
        "hpcsuite`); hpcsuite's arguments are appended", nonempty=True))
    ssh_options: list[str] = field(default_factory=list, metadata=meta(
        "extra arguments for ssh before the destination (e.g. [-F, FILE]); ~/.ssh/config is "
        "read as ssh reads it without them"))
    persist: int = field(default=600, metadata=meta(
        "seconds the shared SSH connection stays open after the last command (ControlPersist)",
        min=0, max=86400))


@record
class Remote(Entry):
    """A remote, with the name remotes.yaml gives it."""

    name: str = ""


def path() -> Path:
    from ..submit.config import user_dir

    return user_dir() / FILENAME


def names(source: Path | None = None) -> list[str]:
    source = source or path()
    return sorted(_read(source)) if source.is_file() else []


def _read(source: Path) -> dict:
    return read_yaml(str(source))


def load(name: str, source: Path | None = None) -> Remote:
    """The remote ``name`` of ``remotes.yaml``; one-line errors naming the file and the key."""
    import re

    source = source or path()
    if not re.fullmatch(NAME, name):
        raise UserError(f"--remote: {name!r} is not a remote's name (letters, digits, . _ -)")
    if not source.is_file():
        raise UserError(f"{source}: no such file: name the remote {name} there (host, workdir, "
                        "command; docs/howto/laptop.md)")
    data = _read(source)
    if name not in data:
        known = [k for k in data if isinstance(k, str)]
        raise UserError(f"{source}: no remote named {name}{close_match(name, known)}; "
                        f"remotes there: {', '.join(sorted(known)) or 'none'}")
    entry = data[name]
    if not isinstance(entry, dict):
        raise ConfigError(str(source), name, "expected a mapping with host, workdir, command")
    got = convert(Entry, entry, str(source), name)
    return Remote(host=got.host, workdir=got.workdir, command=got.command, persist=got.persist,
                  ssh_options=[os.path.expanduser(o) for o in got.ssh_options], name=name)


def chosen(explicit: str | None) -> str | None:
    """The remote a command names: ``--remote NAME``, else ``HPCSUITE_REMOTE``, else None."""
    return explicit or os.environ.get(ENV) or None
