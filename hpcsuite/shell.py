"""Shell quoting for rendered scripts: every value is quoted unless code marked it Raw."""

from __future__ import annotations

import shlex
from typing import Iterable


class Raw(str):
    """A shell fragment written by hpcsuite itself (never from user input), emitted verbatim."""


class Rendered(str):
    """Output of a template block (``{{ super() }}``), already rendered under these rules."""


def check_line_safe(value: str, what: str = "value") -> str:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{what} contains a newline or NUL: {value!r}")
    return value


def quote(value: object) -> str:
    """Quote one value for the shell; Raw passes through. Refuses newline and NUL in both."""
    if isinstance(value, Rendered):
        return str(value)
    if isinstance(value, Raw):
        return check_line_safe(str(value), "shell fragment")
    if isinstance(value, bool):
        value = "1" if value else "0"
    text = check_line_safe(str(value))
    return shlex.quote(text)


def join(argv: Iterable[object]) -> Raw:
    """An argv list as one shell line: user values quoted, Raw words (like "$RUN_DIR") kept."""
    return Raw(" ".join(quote(a) for a in argv))
