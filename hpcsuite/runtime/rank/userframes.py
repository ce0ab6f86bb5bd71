"""The user's first stack frame: where in the user's own code (neither hpcsuite, nor an installed
package or the standard library, nor TensorFlow's generated files) a failure or a stalled rank
is. The one definition the startup watch, a rank's failure and a data worker's traceback use."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parent.parent)
_INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
_GENERATED = "__autograph_generated_file"     # TensorFlow's rewrite of a tf.function, in /tmp


def is_users(filename: str) -> bool:
    """Whether a frame in ``filename`` is the user's code."""
    return not (filename.startswith(_PACKAGE) or filename.startswith(_INSTALLED)
                or filename.startswith("<") or os.path.basename(filename).startswith(_GENERATED))


def user_place(places) -> str | None:
    """``FILE:LINE in FUNCTION`` of the first of ``(file, line, function)`` places that is the
    user's (pass them innermost first), or None."""
    for name, lineno, function in places:
        if not is_users(name):
            continue
        try:
            shown = os.path.relpath(name)
        except ValueError:
            shown = name
        if shown.startswith(".."):
            shown = name
        return f"{shown}:{lineno}" + (f" in {function}" if function else "")
    return None


def user_frame(frames: list) -> str | None:
    """:func:`user_place` of live frames (``sys._current_frames()``'s, innermost first)."""
    return user_place((f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in frames)


def user_site(exc: BaseException) -> str | None:
    """:func:`user_place` of the user's innermost frame in the exception's traceback (for a
    SyntaxError, where the compiler stopped), or None when no frame is the user's."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return user_place([(exc.filename, exc.lineno, None)])
    frames = traceback.extract_tb(exc.__traceback__)
    return user_place((f.filename, f.lineno, f.name) for f in reversed(frames))


def user_traceback(exc: BaseException) -> str:
    """The exception's traceback from the user's first frame on, as Python prints it (without
    the last newline): from the first frame :func:`is_users` says is the user's, else the first
    outside hpcsuite, else all of it."""
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [i for i, f in enumerate(frames) if not f.filename.startswith(_PACKAGE)]
    user = [i for i in outside if is_users(frames[i].filename)]
    start = (user or outside or [0])[0]
    return "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames[start:]),
                    *traceback.format_exception_only(type(exc), exc)]).rstrip()
