"""A site profile's `python:` runs the ranks: `render` (and `submit`) say so in one note when
that is not the interpreter hpcsuite runs under, since a venv of the user's own then is not the
job's (docs/admin/install.md)."""

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main

from conftest import REPO, SBATCH

SITE_PYTHON = "/opt/hpcsuite/0.1.0-openmpi4/bin/python"


def notes(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("note:")]


def render(work, python: str, spec: str = "quickstart.yaml"):
    """`hpcsuite render SPEC` under a site profile (sbatch/profile.yaml's, its python replaced)."""
    text = (SBATCH / "profile.yaml").read_text()
    assert "\npython: python3 " in text
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "profile.yaml").write_text(text.replace("\npython: python3 ", f"\npython: {python} "))
    return CliRunner().invoke(main, ["render", str(SBATCH / spec)], catch_exceptions=False)


def test_render_notes_that_the_site_python_runs_the_ranks(work):
    result = render(work, SITE_PYTHON)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("#!/bin/bash") and f"HPCSUITE_PY={SITE_PYTHON}" in result.stdout
    assert notes(result) == [f"note: {SBATCH / 'quickstart.yaml'}: python: the ranks run the site profile's "
                     f"python ({SITE_PYTHON}), not the one hpcsuite runs under ({sys.executable}): "
                     "packages installed only there are not the job's"], result.stderr


def test_no_note_when_the_site_python_is_this_one(work):
    for python in {sys.executable, str(Path(sys.executable).with_name("python3"))}:
        if Path(python).exists():
            result = render(work, python)
            assert result.exit_code == 0 and notes(result) == [], (python, result.stderr)


@pytest.mark.parametrize("python, spec", [
    ("python3", "quickstart.yaml"),               # a name: the job's PATH finds it
    (SITE_PYTHON, "container-apptainer.yaml"),    # the image's python runs the ranks
])
def test_no_note_when_the_site_python_is_not_the_ranks_or_not_known_here(work, python, spec):
    result = render(work, python, spec)
    assert result.exit_code == 0 and notes(result) == [], result.stderr


def test_install_md_shows_the_note_as_render_words_it(monkeypatch):
    import docblocks
    from hpcsuite.runner.prepare import python_notes
    from hpcsuite.submit.site_profile import SiteProfile

    page = REPO / "docs" / "admin" / "install.md"
    shown = [b.text.strip() for b in docblocks.blocks([page])
             if b.lang == "text" and b.text.startswith("note:")]
    assert len(shown) == 1, shown
    site, own = re.findall(r"\((/[^)]+)\)", shown[0])
    monkeypatch.setattr(sys, "executable", own)
    job = SimpleNamespace(container=SimpleNamespace(image=None))
    assert [f"note: job.yaml: {n}" for n in python_notes(job, SiteProfile(python=site))] == shown
