"""Load YAML mappings into frozen dataclasses, with errors that name file and dotted key.

A dataclass field declares its type (int, float, str, bool, Literal[...], Optional[...],
dict[str, str], list[...], or another dataclass) and optional metadata: ``min``/``max`` for
numbers, ``pattern`` for strings, ``help`` for docs; for a mapping, ``key_pattern`` with
``key_help`` (the refusal of a key that does not match it) and ``keys`` (what the keys are, for
the generated reference). Unknown keys are refused with the list of valid ones and the close
match.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from typing import Any, Literal, get_args, get_origin

import yaml

from ..errors import ConfigError, UserError, close_match, key_text, show
from .strict_yaml import MAX_FILE_BYTES, Ambiguous, Number, StrictYAMLError, load

# The longest string any value may be (a path is at most 4096 bytes on Linux).
MAX_STRING = 4096


def read_yaml(path: str) -> dict:
    """Parse a YAML file that must hold a mapping; errors name the file and line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a YAML file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; a job spec or "
                        "profile is a few hundred bytes")
    try:
        data = load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except StrictYAMLError as e:
        raise UserError(f"{path}:{e.line}: {e}" if e.line else f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path, "", f"expected a mapping of keys, got {_kind(data)}")
    return data


def _kind(value: Any) -> str:
    for tp, word in ((bool, "a boolean"), (dict, "a mapping"), (list, "a list"), (str, "a string"),
                     (int, "an integer"), (float, "a number"), (type(None), "nothing")):
        if isinstance(value, tp):
            return word
    return type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def build(cls: type, data: Any, source: str, path: str = "", partial: bool = False) -> Any:
    """Build dataclass ``cls`` from ``data`` (a mapping), validating every value.

    With ``partial``, ``data`` may be any subset of the keys (one layer of a configuration):
    every value is checked, nothing is required, and the checked mapping is returned."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, path or "(top)", f"expected a mapping, got {_kind(data)}")
    hints, fields = _schema(cls)
    for key in data:
        if not isinstance(key, str) or key not in fields:
            valid = ", ".join(sorted(fields))
            name = key_text(key)
            # A key of one of its sections, written a level too high, says where it goes
            # (before a close match: the exact key is likelier than a near one).
            hint = (_belongs_under(cls, key, path) or close_match(key, fields)) \
                if isinstance(key, str) and len(key) < 100 else ""
            raise ConfigError(source, _join(path, name), f"unknown key{hint}; valid keys: {valid}")
    values = {}
    for name, f in fields.items():
        key_path = _join(path, name)
        if name in data:
            values[name] = convert(hints[name], data[name], source, key_path, f.metadata, partial)
        elif partial:
            continue
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(source, key_path, "required key is missing")
    return values if partial else cls(**values)


def _belongs_under(cls: type, key: str, path: str) -> str:
    """' (it goes under train: train.tracking)' when ``key``, unknown in ``cls``, is a key of
    one of its sections (a key written one level too high), else ''."""
    hints, fields = _schema(cls)
    for name in fields:
        section = next((a for a in (hints[name], *get_args(hints[name]))
                        if dataclasses.is_dataclass(a)), None)
        if section is not None and key in _schema(section)[1]:
            where = _join(path, name)
            return f" (it goes under {name}: {_join(where, key)})"
    return ""


@functools.cache
def _schema(cls: type) -> tuple[dict, dict]:
    """A dataclass's resolved annotations and fields (typing.get_type_hints evaluates every
    annotation string on each call)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls) if f.init}


def convert(tp: Any, value: Any, source: str, path: str, meta: Any = None,
            partial: bool = False) -> Any:
    """``value`` (from ``source``, at ``path``) as the schema type ``tp``, or one ConfigError
    naming the file and key. ``meta``: the field's constraints (range, pattern, ...)."""
    meta = meta or {}
    if isinstance(value, Ambiguous):
        raise ConfigError(source, path, _ambiguous(value, path))
    if tp is Any:
        return _plain(value, source, path)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _union(args, value, source, path, meta, partial)
    if origin is Literal:
        return _literal(args, value, source, path, meta)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, source, path, partial)
    if origin is dict:
        return _mapping(args, value, source, path, meta, partial)
    if origin in (list, tuple):
        return _sequence(origin, args, value, source, path, meta, partial)
    scalar = _SCALARS.get(tp)
    if scalar is None:
        raise TypeError(f"schema type {tp!r} at {path} is not supported")  # a bug in hpcsuite
    return scalar(value, source, path, meta)


def _union(args, value, source, path, meta, partial):
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
        return convert(inner[0], value, source, path, meta, partial)
    records = [a for a in inner if dataclasses.is_dataclass(a)]
    if isinstance(value, dict) and len(records) == 1:
        return convert(records[0], value, source, path, meta, partial)   # its own errors
    # Several types (true/false or a word, as Slurm's --exclusive): the first that takes
    # the value wins; if none does, one error naming them all.
    last: ConfigError | None = None
    for tp_i in inner:
        try:
            return convert(tp_i, value, source, path, meta, partial)
        except ConfigError as e:
            last = e
    if meta.get("union_help"):
        raise ConfigError(source, path, f"{show(value)} is not valid: {meta['union_help']}")
    raise last   # the last type's refusal (the most general one: text)


def _literal(args, value, source, path, meta):
    if meta.get("upper") and isinstance(value, str) and value.upper() in args:
        value = value.upper()   # Slurm reads these words in any case
    if isinstance(value, (dict, list)) or value not in args:
        choices = ", ".join(str(a) for a in args)
        hint = close_match(str(value), [str(a) for a in args]) if isinstance(value, str) else ""
        hint = meta.get("hints", {}).get(value, hint) if isinstance(value, str) else hint
        raise ConfigError(source, path, f"{show(value)} is not one of: {choices}{hint}")
    return value


def _mapping(args, value, source, path, meta, partial):
    if not isinstance(value, dict):
        raise ConfigError(source, path, f"expected a mapping, got {_kind(value)}")
    kt, vt = args
    key_pattern = meta.get("key_pattern")
    reserved = meta.get("reserved_keys")
    names = {}
    for k in value:
        if not isinstance(k, str):
            raise ConfigError(source, path, _not_text(k))
        names[k] = key_text(k)
        where = f"{path}.{names[k]}"
        if len(k) > 64:
            raise ConfigError(source, where, "a key must be text of at most 64 characters")
        if key_pattern and not (isinstance(k, str) and re.fullmatch(key_pattern, k)):
            raise ConfigError(source, where, meta.get("key_help", "not a valid key"))
        if reserved and reserved(k):
            raise ConfigError(source, where, reserved(k))
    value_meta = meta.get("values")
    return {convert(kt, k, source, f"{path}.{names[k]}"):
            convert(vt, v, source, f"{path}.{names[k]}", value_meta, partial)
            for k, v in value.items()}


def _sequence(origin, args, value, source, path, meta, partial):
    split = meta.get("split")
    if split and isinstance(value, str):   # mail_type: END,FAIL as Slurm writes it
        value = [part.strip() for part in value.split(split)]
    if not isinstance(value, list):
        raise ConfigError(source, path, f"expected a list, got {_kind(value)}")
    # Constraints (min, pattern) on a list field apply to each item.
    items = [convert(args[0], v, source, f"{path}[{i}]", meta, partial)
             for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _bool(value, source, path, meta):
    if not isinstance(value, bool):
        raise ConfigError(source, path, f"expected true or false, got {_kind(value)} {show(value)}")
    return value


def _int(value, source, path, meta):
    if isinstance(value, float) and isinstance(value, Number) and value.is_integer() \
            and "e" in value.text.lower():
        value = int(value)   # 1e5 written for an integer
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(source, path, f"expected an integer, got {_kind(value)} {show(value)}")
    _range(value, source, path, meta)
    return int(value)


def _float(value, source, path, meta):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(source, path, f"expected a number, got {_kind(value)} {show(value)}")
    if not math.isfinite(value):
        raise ConfigError(source, path, f"{show(value)} is not a finite number")
    _range(float(value), source, path, meta)
    return float(value)


def _str(value, source, path, meta):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and meta.get("coerce"):
        value = value.text if isinstance(value, Number) else str(value)
    if not isinstance(value, str):
        raise ConfigError(source, path, f"expected a string, got {_kind(value)} {show(value)}"
                                        + _quote_hint(value))
    if "\n" in value or "\r" in value or "\0" in value:
        raise ConfigError(source, path, "newline and NUL characters are not allowed")
    limit = meta.get("max_length", MAX_STRING)
    if len(value) > limit:
        raise ConfigError(source, path, f"{show(value)} is longer than {limit} characters")
    if meta.get("nonempty") and not value:
        raise ConfigError(source, path, "must not be empty")
    pattern = meta.get("pattern")
    if pattern and not re.fullmatch(pattern, value):
        raise ConfigError(source, path, f"{show(value)} is not valid: "
                                        f"{meta.get('pattern_help', pattern)}")
    check = meta.get("check")
    if check and check(value):
        raise ConfigError(source, path, check(value))
    return str(value)


_SCALARS = {bool: _bool, int: _int, float: _float, str: _str}


def _plain(value: Any, source: str, path: str) -> Any:
    """Any JSON-like value (for free-form arguments), with the limits every value has."""
    if isinstance(value, Ambiguous):
        raise ConfigError(source, path, _ambiguous(value, path))
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(source, path, f"{show(value)} is not a finite number")
        return float(value)
    if isinstance(value, str):
        if "\0" in value:
            raise ConfigError(source, path, "NUL characters are not allowed")
        if len(value) > MAX_STRING:
            raise ConfigError(source, path, f"{show(value)} is longer than {MAX_STRING} characters")
        return str(value)
    if isinstance(value, list):
        return [_plain(v, source, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(source, path, _not_text(k))
            out[k] = _plain(v, source, f"{path}.{key_text(k)}")
        return out
    raise ConfigError(source, path, f"{_kind(value)} is not a plain value")


def _not_text(key: object) -> str:
    """The refusal of a mapping key that YAML read as something other than text."""
    if key is None:
        return "a key is empty or null: keys must be text"
    return f"the key {show(key)} is {_kind(key)}: keys must be text (put it in quotes)"


def _ambiguous(value: Ambiguous, path: str) -> str:
    key = path.rsplit(".", 1)[-1]
    if not isinstance(value.meaning, (int, float)):   # pragma: no cover - the resolver's job
        return f"{value} is ambiguous in YAML; write it in quotes"
    if ":" in value:
        return (f"{value} unquoted is the number {value.meaning:g} in YAML (base 60); write "
                f"{key}: \"{value}\" in quotes")
    return (f"{value} unquoted is the octal number {value.meaning} in YAML 1.1; write "
            f"{int(value.lstrip('+-0') or '0')} for the number, or \"{value}\" in quotes for the text")


def _quote_hint(value: Any) -> str:
    if isinstance(value, bool):
        return " (YAML reads yes/no/on/off/true/false as booleans; quote it for the text)"
    if value is None:
        return " (an empty value or ~ is null in YAML; quote it for the text)"
    return ""


def _range(value: float, source: str, path: str, meta: dict) -> None:
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and value < lo:
        raise ConfigError(source, path, f"{value} is below the minimum {lo}")
    if hi is not None and value > hi:
        raise ConfigError(source, path, f"{value} is above the maximum {hi}")


def key_paths(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key a dataclass tree accepts (for locks and --set)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if get_origin(tp) in (typing.Union, types.UnionType):
            tp = [a for a in get_args(tp) if a is not type(None)][0]
        out.append(_join(prefix, f.name))
        if dataclasses.is_dataclass(tp):
            out += key_paths(tp, _join(prefix, f.name))
    return out


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain JSON-able data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("omit_unset") and getattr(obj, f.name) is None)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj
