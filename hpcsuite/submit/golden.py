"""The example specs in sbatch/ and the scripts they render to, kept in sync by a test.

Each ``sbatch/NAME.yaml`` sits beside ``sbatch/NAME.sbatch``, rendered with the built-in
templates only and the example site profile ``sbatch/profile.yaml`` (or its own
``sbatch/profile-NAME.yaml``: a site with a container runtime), so reviewers see a template
change as a diff of real scripts. ``make golden`` rewrites them.
"""

from __future__ import annotations

from pathlib import Path

from .config import resolve
from .plan import plan
from .templating import SearchPath

PROFILE = "profile.yaml"


def example_specs(sbatch_dir: Path) -> list[Path]:
    return sorted(p for p in Path(sbatch_dir).glob("*.yaml") if not p.name.startswith("profile"))


def profile_of(spec: Path, default: str | None = None) -> str:
    """The site profile an example renders with: its own profile-NAME.yaml, else ``default``
    (else the example profile)."""
    own = spec.with_name(f"profile-{spec.stem}.yaml")
    return str(own) if own.is_file() else default or str(spec.with_name(PROFILE))


def expected_scripts(sbatch_dir: Path) -> dict[Path, str]:
    sbatch_dir = Path(sbatch_dir)
    out = {}
    for spec in example_specs(sbatch_dir):
        r = resolve(str(spec), profile_of(spec), ambient=False)
        out[spec.with_suffix(".sbatch")] = plan(r.job, r.profile, SearchPath.builtin_only(), r.locks).script
    return out


def examples_dir() -> Path:
    """The example specs as installed (sbatch/ in the source tree, hpcsuite.examples in a wheel)."""
    from importlib import resources

    return Path(str(resources.files("hpcsuite.examples")))
