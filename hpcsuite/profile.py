"""The site profile: what the cluster looks like and how jobs start on it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

from .schema import build, read_yaml


@dataclass(frozen=True)
class SiteProfile:
    python: Optional[str] = field(default=None, metadata={
        "help": "interpreter that runs `hpcsuite train` on compute nodes "
                "(default: the one running hpcsuite at submit time)"})
    setup: list[str] = field(default_factory=list, metadata={
        "help": "shell lines run before training (module loads, venv activation)"})
    env: dict[str, str] = field(default_factory=dict, metadata={
        "help": "environment for every rank (UCX_*, NCCL_*, OMPI_MCA_*)"})

    def interpreter(self) -> str:
        return self.python or sys.executable


def load_profile(path: str | None) -> SiteProfile:
    if not path:
        return SiteProfile()
    return build(SiteProfile, read_yaml(path), path)
