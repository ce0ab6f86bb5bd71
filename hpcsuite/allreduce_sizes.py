"""What both sides of the allreduce benchmark agree on: the message sizes (the ``--sizes``
syntax, the default sweep, the largest size) and the default time budget.

The rank program (:mod:`hpcsuite.runtime.checks.allreduce_bench`) reads its ``--sizes`` and
``--budget`` with these; the login side (`hpcsuite bench allreduce`, a study's benchmark
points through :mod:`hpcsuite.study.allreduce_job`) checks and prints sizes with the same ones
before the job is submitted. Standard library only: the login-node command imports it.
"""

from __future__ import annotations

import re

DEFAULT_SIZES = tuple(4 * 4 ** k for k in range(13))      # 4 B, 16 B, ... 64 MiB
MAX_SIZE = 1 << 30                                         # 1 GiB: several buffers per rank
DEFAULT_BUDGET_S = 0.4
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"([0-9]{1,10})\s*([KMG]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"4"``, ``"64K"``, ``"1M"``, ``"1MiB"`` -> bytes (K/M/G are powers of 1024). Raises
    ValueError saying what is wrong."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text.strip()!r} is not a size (a number with an optional K, M or G "
                         "suffix, e.g. 4, 64K, 16M)")
    size = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if size <= 0 or size % 4:
        raise ValueError(f"{text.strip()!r} is not a positive multiple of 4 bytes (the tensors "
                         "are float32)")
    if size > MAX_SIZE:
        raise ValueError(f"{text.strip()!r} is more than 1G")
    return size


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes -> sorted distinct bytes (ValueError on a bad one)."""
    parts = text.split(",")
    if not text.strip() or any(not p.strip() for p in parts):
        raise ValueError(f"{text!r}: give comma-separated sizes like 4,1K,64K,1M,16M")
    return sorted({parse_size(p) for p in parts})


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"

