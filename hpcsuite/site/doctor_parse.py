"""Parsers of what `hpcsuite doctor` asks (sinfo, srun --mpi=list, an interface list) and of
``horovodrun --check-build`` (a study bundle made before doctor asked Horovod's modules
directly records its text): small pure functions, tested on recorded output."""

from __future__ import annotations

import re


def parse_partitions(text: str) -> dict[str, str]:
    """``sinfo -h -o '%R %a'`` -> {partition: availability (up, down, ...)}."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            found[parts[0]] = parts[1]
    return found


def parse_mpi_list(text: str) -> set[str]:
    """``srun --mpi=list``: the plugin names, including the specific pmix versions."""
    names: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("specific pmix plugin versions available:"):
            names.update(v.strip() for v in line.split(":", 1)[1].split(","))
        elif line and " " not in line:
            names.add(line)
    return names - {""}


def parse_check_build(text: str) -> dict[str, set[str]]:
    """``horovodrun --check-build`` -> {"frameworks"|"controllers"|"operations": {marked}}."""
    sections = {"Available Frameworks": "frameworks", "Available Controllers": "controllers",
                "Available Tensor Operations": "operations"}
    out: dict[str, set[str]] = {v: set() for v in sections.values()}
    current = None
    for line in text.splitlines():
        head = line.strip().rstrip(":")
        if head in sections:
            current = sections[head]
            continue
        m = re.match(r"\s*\[(X| )\]\s+(\S+)", line)
        if m and current and m.group(1) == "X":
            out[current].add(m.group(2))
    return out


def interface_names(value: str) -> tuple[list[str], bool]:
    """NCCL_SOCKET_IFNAME-style value -> (prefixes or names, exact); ``^`` excludes (not checked)."""
    if value.startswith("^"):
        return [], False
    exact = value.startswith("=")
    return [v for v in value.lstrip("=").split(",") if v], exact
