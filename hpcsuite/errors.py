"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

from typing import Iterable


class UserError(Exception):
    """Bad input or a wrong environment: printed as ``error: <message>``, exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A bad value in a YAML file, located by file and dotted key path."""

    def __init__(self, source: str, key: str, message: str):
        self.source, self.key = source, key
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class JobFailed(Exception):
    """A submitted job ended in a state other than COMPLETED (exit code 1)."""

    exit_code = 1


class JobInputFailed(JobFailed):
    """A submitted job ended on an input error hpcsuite reported in the job (exit code 2)."""

    exit_code = 2


class JobPreempted(JobFailed):
    """A job stopped early after saving a checkpoint (exit code 3): submit again to resume."""

    exit_code = 3


def close_match(word: str, options: Iterable[str]) -> str:
    """' (did you mean "x"?)' when an option is close to ``word``, else ''."""
    import difflib

    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f' (did you mean "{found[0]}"?)' if found else ""


def key_text(key: object) -> str:
    """A mapping key as it appears in a dotted path: plain words as they are, anything else
    (spaces, colons, quotes, not a string, too long) quoted and cut short."""
    if isinstance(key, str) and 0 < len(key) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-")
                                                        for c in key):
        return key
    return show(key, 40)


def show(value: object, limit: int = 48) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error quotes a bad value, never all of it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return f"{value[:limit]!r}… ({len(value)} characters)"
    return f"{text[:limit]}…"


def count(n: object, noun: str) -> str:
    """``1 rank``, ``2 ranks``: a count and its noun (plural by an s; nouns here are regular)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def permission_denied(path: object) -> UserError:
    """A file this user may not read, said as that (never as "none" or "missing"): its owner and
    mode, and what lets a group share it."""
    import os
    import pwd

    try:
        st = os.stat(path)
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        held = f" (owner {owner}, mode {st.st_mode & 0o777:o})"
    except OSError:
        held = ""
    return UserError(f"{path}: permission denied{held}: its owner can make it readable (chmod "
                     "g+r); files hpcsuite writes follow the umask, so a group sharing a "
                     "directory runs with umask 002")
