"""The example specs in sbatch/ and the scripts they render to, kept in sync by a test.

Each ``sbatch/NAME.yaml`` sits beside ``sbatch/NAME.sbatch``, rendered with the built-in
templates only and the example site profile ``sbatch/profile.yaml``, so reviewers see a
template change as a diff of real scripts. ``make golden`` rewrites them.
"""

from __future__ import annotations

from pathlib import Path

from .config import resolve
from .plan import plan
from .templating import SearchPath

PROFILE = "profile.yaml"


def example_specs(sbatch_dir: Path) -> list[Path]:
    return sorted(p for p in Path(sbatch_dir).glob("*.yaml") if p.name != PROFILE)


def expected_scripts(sbatch_dir: Path) -> dict[Path, str]:
    sbatch_dir = Path(sbatch_dir)
    out = {}
    for spec in example_specs(sbatch_dir):
        r = resolve(str(spec), str(sbatch_dir / PROFILE), ambient=False)
        out[spec.with_suffix(".sbatch")] = plan(r.job, r.profile, SearchPath.builtin_only(), r.locks).script
    return out


def examples_dir() -> Path:
    """The example specs as installed (sbatch/ in the source tree, hpcsuite.examples in a wheel)."""
    from importlib import resources

    return Path(str(resources.files("hpcsuite.examples")))
