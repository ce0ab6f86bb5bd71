"""YAML read the way a job-spec author means it, and refused where YAML would guess.

PyYAML follows YAML 1.1, whose implicit typing reinterprets text a user wrote:
``time: 10:00`` is the integer 600 (base-60), ``010`` is octal 8, while ``lr: 1e-3`` stays a
string. Here:

- ``1e-3``, ``2E5`` are numbers (as in YAML 1.2 and JSON);
- base-60 numbers (``10:00``, ``1:30:00``) and leading-zero integers (``010``) are *ambiguous*:
  they load as :class:`Ambiguous`, which the schema refuses with a hint to quote them;
- numbers remember the text they were written as (:class:`Number`), so a string field given
  ``4`` or ``1e-3`` gets exactly that text;
- duplicate keys in a mapping are an error (PyYAML silently keeps the last);
- a file over :data:`MAX_FILE_BYTES`, nesting deeper than :data:`MAX_DEPTH`, or more than
  :data:`MAX_NODES` values once aliases are expanded is refused before it can cost memory
  (an "alias bomb" is a few lines that expand to billions of values), and libyaml's composer,
  which recurses in C, never sees deep nesting.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_NODES = 20_000

INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
AMBIGUOUS = "tag:hpcsuite,2026:ambiguous"


class StrictYAMLError(Exception):
    """A problem at a place in the file: ``line`` is 1-based (0 when unknown)."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


class Ambiguous(str):
    """A plain scalar YAML 1.1 would turn into a number the user likely did not mean."""

    meaning: Any = None


class Number:
    """Mixin: the source text of a number (``YInt``/``YFloat``)."""

    text: str = ""


class YInt(int, Number):
    pass


class YFloat(float, Number):
    pass


_DIGIT_START = list("-+0123456789")


class StrictLoader(_Base):
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (INT, FLOAT)]
        for first, resolvers in _Base.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise StrictYAMLError(key_node.start_mark.line + 1,
                                      "a mapping key must be a plain value") from None
            if first is not None:
                raise StrictYAMLError(key_node.start_mark.line + 1,
                                      f"duplicate key {_show(key)} (first on line {first}); "
                                      "YAML would silently keep only the last one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# Order matters: the first resolver that matches wins.
# Exactly what YAML 1.1 (PyYAML's resolver) would turn into a number here.
StrictLoader.add_implicit_resolver(AMBIGUOUS, re.compile(
    r"^[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+$"                   # base-60 int: 10:00, 1:30:00
    r"|^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*$"          # base-60 float: 1:30.5
    r"|^[-+]?0[0-7_]+$"), _DIGIT_START)                         # YAML 1.1 octal: 010
StrictLoader.add_implicit_resolver(INT, re.compile(
    r"^[-+]?(?:0|[1-9][0-9_]*)$|^[-+]?0x[0-9a-fA-F_]+$|^[-+]?0b[01_]+$|^[-+]?0o[0-7_]+$"),
    _DIGIT_START)
StrictLoader.add_implicit_resolver(FLOAT, re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?$"
    r"|^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"
    r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"), _DIGIT_START + ["."])


def _int(loader, node):
    value = YInt(int(node.value.replace("_", ""), 0))
    value.text = node.value
    return value


def _float(loader, node):
    text = node.value.replace("_", "").lower()
    special = {".inf": "inf", "+.inf": "inf", "-.inf": "-inf", ".nan": "nan"}
    value = YFloat(float(special.get(text, text)))
    value.text = node.value
    return value


def _ambiguous(loader, node):
    value = Ambiguous(node.value)
    try:
        value.meaning = yaml.load(node.value, Loader=_Base)
    except yaml.YAMLError:  # pragma: no cover - the regex admits only numbers
        value.meaning = None
    return value


StrictLoader.add_constructor(INT, _int)
StrictLoader.add_constructor(FLOAT, _float)
StrictLoader.add_constructor(AMBIGUOUS, _ambiguous)

_STARTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_ENDS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_shape(text: str) -> None:
    """Walk the event stream (libyaml's parser keeps its own stack): refuse deep nesting and
    huge documents before the recursive composer builds anything."""
    depth = events = 0
    for event in yaml.parse(text, Loader=_Base):
        events += 1
        if isinstance(event, _STARTS):
            depth += 1
            if depth > MAX_DEPTH:
                raise StrictYAMLError(event.start_mark.line + 1,
                                      f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, _ENDS):
            depth -= 1
        if events > 2 * MAX_NODES:
            raise StrictYAMLError(event.start_mark.line + 1,
                                  f"more than {MAX_NODES} values in one file")


def expanded_size(data: Any) -> int:
    """How many values ``data`` holds with every alias expanded (shared objects counted each
    time they are reached), without expanding anything: sizes are memoised by identity."""
    memo: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)) or (id(node) in memo and not done):
            continue
        children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        if done:
            memo[id(node)] = 1 + sum(memo.get(id(c), 1) if isinstance(c, (dict, list)) else 1
                                     for c in children)
            continue
        if id(node) in visiting:
            raise StrictYAMLError(0, "a value contains itself (a recursive alias)")
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)))
    return memo.get(id(data), 1)


def load(text: str) -> Any:
    """Parse one YAML document with the rules above."""
    _check_shape(text)
    data = yaml.load(text, Loader=StrictLoader)
    if expanded_size(data) > MAX_NODES:
        raise StrictYAMLError(0, f"more than {MAX_NODES} values once aliases are expanded "
                                 "(anchors and aliases may repeat a block, not multiply it)")
    return data


def _show(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
