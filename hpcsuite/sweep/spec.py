"""A sweep file and its elements: a base job spec, the keys to vary, and how.

::

    name: lr-seed
    base: job.yaml                  # a job spec, relative to this file
    axes:                           # any job key --set takes, and its values
      train.lr: [0.01, 0.05, 0.1]
      train.seed: [1, 2]
    # random: {count: 8, seed: 0}   # draw COUNT elements instead of the whole grid; axes may
    #                               # then also be {uniform: [lo, hi]}, {log_uniform: [lo, hi]},
    #                               # {randint: [lo, hi]} or {choice: [...]}
    max_parallel: 2                 # elements running at once (sbatch --array=...%K)
    metric: {name: val_accuracy, goal: max}   # what "best" means in the report

Each element is the base spec with one ``--set KEY=VALUE`` per axis (:func:`set_text` writes
the value as text that reads back as the same value), so an element goes through exactly
what a ``--set`` goes through: the schema, the site's locks, lint and the header read-back.
Expanding is deterministic: the grid in the order the axes are written, random draws from
``random.seed``.
"""

from __future__ import annotations

import itertools
import json
import math
import random as _random
from dataclasses import field
from typing import Any, Literal, Optional

from ..errors import ConfigError, show
from ..records import Record, meta, record
from ..submit.schema import build, read_yaml
from ..submit.values import NAME, NAME_HELP, PATH, PATH_HELP

MAX_ELEMENTS = 1000          # Slurm's default MaxArraySize is 1001: indices 0..1000
# Metrics a report can rank by, and the goal each has unless the sweep says otherwise.
METRICS = {"val_accuracy": "max", "val_loss": "min", "loss": "min", "samples_per_s": "max"}


def metric_goal(name: str, goal: str | None = None) -> str:
    """Whether the best element has the highest (max) or the lowest (min) ``name``: the
    sweep's own goal, else the metric's usual one (a script's metrics.KEY: max)."""
    return goal or METRICS.get(name, "max")
DISTRIBUTIONS = ("uniform", "log_uniform", "randint", "choice")
# Keys an axis may not vary: the sweep sets them for every element.
SWEEP_SETS = ("name",)


@record
class Metric(Record):
    name: str = field(default="val_accuracy", metadata=meta(
        "what ranks the elements: val_accuracy (best validation accuracy), val_loss (lowest "
        "validation loss), loss (final training loss), samples_per_s, or metrics.KEY (a "
        "script's own number)", pattern=r"val_accuracy|val_loss|loss|samples_per_s|"
                                        r"metrics\.[A-Za-z_][A-Za-z0-9_]{0,63}",
        pattern_help="val_accuracy, val_loss, loss, samples_per_s or metrics.KEY"))
    goal: Optional[Literal["max", "min"]] = field(default=None, metadata=meta(
        "max or min (default: max for accuracy and samples/s, min for losses)"))


@record
class Random(Record):
    count: int = field(metadata=meta("elements to draw", min=1, max=MAX_ELEMENTS))
    seed: int = field(default=0, metadata=meta("the draws' seed: the same seed, the same elements",
                                             min=0, max=2**32 - 1))


@record
class Sweep(Record):
    name: str = field(metadata=meta("sweep name: its directory, and every element's job name",
                                  pattern=NAME, pattern_help=NAME_HELP))
    base: str = field(metadata=meta("the base job spec (YAML), relative to the sweep file",
                                  pattern=PATH, pattern_help=PATH_HELP))
    axes: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "job key -> its values (a list), e.g. train.lr: [0.01, 0.1]; with random also a "
        "distribution: {uniform: [lo, hi]}, {log_uniform: [lo, hi]}, {randint: [lo, hi]}, "
        "{choice: [...]}", key_pattern=r"[A-Za-z][A-Za-z0-9_.]{0,199}",
        key_help="not a dotted job key",
        keys="dotted job keys (train.lr)"))
    random: Optional[Random] = field(default=None, metadata=meta(
        "draw count elements at random instead of the whole grid"))
    max_parallel: Optional[int] = field(default=None, metadata=meta(
        "elements running at once (default and ceiling: the site's sweep_max_parallel)",
        min=1, max=10000))
    metric: Metric = field(default_factory=Metric)
    output_dir: str = field(default="sweeps", metadata=meta(
        "where the sweep directory goes, relative to the sweep file", pattern=PATH,
        pattern_help=PATH_HELP))


@record
class Element(Record):
    index: int
    values: dict          # axis key -> value
    sets: list            # the same as --set KEY=VALUE

    def label(self) -> str:
        return ", ".join(f"{k}={show(v, 40) if isinstance(v, str) else v}"
                         for k, v in self.values.items())


def load_sweep(path: str) -> Sweep:
    """The sweep file at ``path``, every axis checked (one line naming the key when not)."""
    from ..submit.config import check_job_key

    sweep = build(Sweep, read_yaml(path), path)
    if not sweep.axes:
        raise ConfigError(path, "axes", "no axes: name at least one job key and its values")
    for key, values in sweep.axes.items():
        where = f"axes.{key}"
        if key in SWEEP_SETS:
            raise ConfigError(path, where, f"the sweep sets {key} for every element (its own "
                                           f"{key}); it cannot be an axis")
        check_job_key(key, path, where)
        _check_axis(values, sweep.random is not None, path, where)
    if sweep.random is None:
        count = math.prod(len(v) for v in sweep.axes.values())
        if count > MAX_ELEMENTS:
            raise ConfigError(path, "axes", f"the grid has {count} elements; at most "
                                            f"{MAX_ELEMENTS} (or draw some with random: "
                                            "{count: N})")
    return sweep


def _check_axis(values: Any, random: bool, path: str, where: str) -> None:
    if isinstance(values, dict):
        if not random:
            raise ConfigError(path, where, "a distribution needs random: {count: N} (a grid "
                                           "takes a list of values)")
        if len(values) != 1 or next(iter(values)) not in DISTRIBUTIONS:
            raise ConfigError(path, where, f"expected one of {', '.join(DISTRIBUTIONS)}, e.g. "
                                           "{log_uniform: [0.001, 0.1]}")
        kind, args = next(iter(values.items()))
        where = f"{where}.{kind}"
        if kind == "choice":
            _check_values(args, path, where)
            return
        if not (isinstance(args, list) and len(args) == 2 and all(_is_number(a) for a in args)):
            raise ConfigError(path, where, "expected [low, high]: two numbers")
        low, high = args
        if kind == "randint" and not all(type(a) is int for a in args):
            raise ConfigError(path, where, "randint takes two integers")
        if not low < high and not (kind == "randint" and low == high):
            raise ConfigError(path, where, f"low {low} must be below high {high}")
        if kind == "log_uniform" and low <= 0:
            raise ConfigError(path, where, f"log_uniform needs low > 0, got {low}")
        return
    _check_values(values, path, where)


def _check_values(values: Any, path: str, where: str) -> None:
    if not isinstance(values, list) or not values:
        raise ConfigError(path, where, "expected a non-empty list of values")
    if len(values) > MAX_ELEMENTS:
        raise ConfigError(path, where, f"{len(values)} values; at most {MAX_ELEMENTS}")
    for i, value in enumerate(values):
        if not isinstance(value, (str, int, float)):   # bool is an int
            raise ConfigError(path, f"{where}[{i}]", "an axis value is one value (as --set "
                                                     "takes it), not a list or mapping")
    if len({json.dumps(v) for v in values}) != len(values):
        raise ConfigError(path, where, "a value appears twice")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------------- elements

def expand(sweep: Sweep) -> list[Element]:
    """Every element of ``sweep``, indexed from 0: the grid (the last axis varies fastest)
    or ``random.count`` draws."""
    keys = list(sweep.axes)
    if sweep.random is None:
        combos = itertools.product(*(sweep.axes[k] for k in keys))
        rows = [dict(zip(keys, combo)) for combo in combos]
    else:
        rng = _random.Random(sweep.random.seed)
        rows = [{k: draw(rng, sweep.axes[k]) for k in keys} for _ in range(sweep.random.count)]
    return [Element(index=i, values=row, sets=[f"{k}={set_text(k, v)}" for k, v in row.items()])
            for i, row in enumerate(rows)]


def draw(rng: _random.Random, axis: Any) -> Any:
    """One value of an axis: a list or {choice: [...]} picks one; uniform and log_uniform
    draw a float (6 significant digits, so its --set text stays short); randint an integer."""
    if isinstance(axis, list):
        return rng.choice(axis)
    kind, args = next(iter(axis.items()))
    if kind == "choice":
        return rng.choice(args)
    if kind == "randint":
        return rng.randint(args[0], args[1])
    low, high = float(args[0]), float(args[1])
    if kind == "log_uniform":
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        value = rng.uniform(low, high)
    return float(f"{value:.6g}")


def set_text(key: str, value: Any) -> str:
    """``value`` as the text of ``--set KEY=TEXT`` that reads back as ``value``: numbers and
    booleans as YAML writes them, text as it is unless YAML would read it as something else
    (then JSON-quoted). ``env.*`` takes its text as typed (no YAML reading)."""
    from ..submit.strict_yaml import load

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if key.startswith("env."):
        return value
    try:
        back = load(value) if value else ""
    except Exception:      # noqa: BLE001 - any text YAML cannot read plainly is quoted
        back = None
    return value if type(back) is str and back == value else json.dumps(value)
