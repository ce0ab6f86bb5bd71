"""Frozen records for the login-node path, cheaper to define than plain frozen dataclasses.

``@dataclass`` compiles a ``__repr__`` and an ``__eq__`` for every class it decorates; with
some twenty records imported by `hpcsuite render` that is ~10 ms of a command whose budget is
measured against importing click, jinja2 and yaml. :func:`record` is ``@dataclass(frozen=True)``
whose ``__repr__`` and ``__eq__`` come from one base class instead, with the same behaviour.
"""

from __future__ import annotations

import dataclasses


class Record:
    __slots__ = ()

    def __repr__(self) -> str:
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                         if f.repr)
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name)
                   for f in dataclasses.fields(self) if f.compare)

    __hash__ = None   # as a frozen dataclass holding lists and dicts: not hashable


def meta(help: str = "", **kw) -> dict:
    """A record field's metadata for :mod:`hpcsuite.submit.schema`: its ``help`` text (the
    generated reference prints it) and checks such as ``min``, ``max`` and ``pattern``."""
    return {"help": help, **kw}


def record(cls: type) -> type:
    """``@record`` on a class deriving from :class:`Record`: a frozen dataclass."""
    return dataclasses.dataclass(frozen=True, repr=False, eq=False)(cls)
