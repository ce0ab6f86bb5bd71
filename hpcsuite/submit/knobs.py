"""The one table of Horovod's knobs (``train.horovod.*``): name, default, the HOROVOD_*
variables each becomes for every rank, and whether a scaling study may sweep it.

:mod:`hpcsuite.submit.spec` takes its defaults from here and refuses the variables in ``env``;
:mod:`hpcsuite.submit.plan` renders the variables with :func:`environment`; :mod:`hpcsuite.study.points`
offers the sweepable ones as ``horovod.<knob>`` axes. Light: the standard library and
:mod:`hpcsuite.shell` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable



@dataclass(frozen=True)
class Knob:
    """One Horovod knob: its train.horovod key, default, and the variables it sets."""
    name: str                                # train.horovod.<name>
    default: Any
    env: tuple[str, ...] = ()                # the variables it sets (at hvd.init())
    sweep: bool = False                      # a study axis: horovod.<name>
    # (value, files) -> the variables; files: the run directory's paths for its outputs
    render: Callable[[Any, dict], dict] = lambda value, files: {}


def _stall_check(seconds: int, files: dict) -> dict:
    if seconds:
        return {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(seconds)}
    return {"HOROVOD_STALL_CHECK_DISABLE": "1"}


def _timeline(on: bool, files: dict) -> dict:
    if on:
        return {"HOROVOD_TIMELINE": files["timeline"]}
    if files.get("window"):     # a window recorded from Python: Horovod must start DYNAMIC
        return {"HOROVOD_TIMELINE": "DYNAMIC"}
    return {}


def _autotune(on: bool, files: dict) -> dict:
    if not on:
        return {}
    return {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": files["autotune_log"]}


KNOBS: tuple[Knob, ...] = (
    Knob("compression", "none", sweep=True),
    Knob("op", "average", sweep=True),
    Knob("fusion_threshold_mb", 64, ("HOROVOD_FUSION_THRESHOLD",), sweep=True,
         render=lambda mb, files: {"HOROVOD_FUSION_THRESHOLD": str(mb * 1024 * 1024)}),
    Knob("cycle_time_ms", 1.0, ("HOROVOD_CYCLE_TIME",), sweep=True,
         render=lambda ms, files: {"HOROVOD_CYCLE_TIME": f"{ms:g}"}),
    Knob("stall_check_seconds", 60,
         ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_DISABLE"), render=_stall_check),
    Knob("stall_shutdown_seconds", 120, ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",),
         render=lambda s, files: {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(s)} if s else {}),
    Knob("timeline", False, ("HOROVOD_TIMELINE",), render=_timeline),
    Knob("autotune", False, ("HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG"), sweep=True,
         render=_autotune),
    Knob("allreduce", True),
)
BY_NAME = {k.name: k for k in KNOBS}
# HOROVOD_* variable -> the knob that sets it (``env`` may not set them itself).
BY_ENV = {var: k.name for k in KNOBS for var in k.env}
SWEEPABLE = tuple(k.name for k in KNOBS if k.sweep)


def default(name: str) -> Any:
    return BY_NAME[name].default


def environment(horovod, files: dict, timeline_window: bool = False) -> dict[str, str]:
    """The HOROVOD_* variables of ``horovod`` (a :class:`hpcsuite.submit.spec.HorovodKnobs`), in the
    table's order. ``files``: ``timeline`` and ``autotune_log``, the run directory's paths as
    shell fragments. ``timeline_window``: train.monitor.timeline_steps records a window of the
    timeline from Python."""
    files = {**files, "window": timeline_window}
    env: dict[str, str] = {}
    for knob in KNOBS:
        env.update(knob.render(getattr(horovod, knob.name), files))
    return env
