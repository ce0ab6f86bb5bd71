"""Template search path, extending the built-in, and the `templates` commands."""

import re

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.submit.templating import builtin_dir

from conftest import SBATCH

QUICK = str(SBATCH / "quickstart.yaml")
PROFILE = str(SBATCH / "profile.yaml")

EXTENDS = """{% extends "builtin/horovod.sbatch.j2" %}
{% block setup %}
# site: scratch lives on the parallel file system
export SCRATCH_ROOT=/lustre/scratch
{{ super() }}
{% endblock %}
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return site


def invoke(*args):
    return CliRunner(mix_stderr=False).invoke(main, list(args), catch_exceptions=False) \
        if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_site_template_extends_builtin_and_overrides_a_block(site):
    (site / "templates" / "horovod.sbatch.j2").write_text(EXTENDS)
    out = invoke("render", QUICK, "--profile", PROFILE).output
    golden = (SBATCH / "quickstart.sbatch").read_text()
    assert "export SCRATCH_ROOT=/lustre/scratch" in out
    # Everything else is the built-in script, line for line (blank lines aside).
    assert [l for l in out.splitlines() if l and "SCRATCH" not in l and not l.startswith("# site")] \
        == [l for l in golden.splitlines() if l]


def test_which_and_list_show_the_winner_and_what_it_shadows(site):
    (site / "templates" / "horovod.sbatch.j2").write_text(EXTENDS)
    assert invoke("templates", "which", "horovod").output.strip() == \
        str(site / "templates" / "horovod.sbatch.j2")
    listing = invoke("templates", "list").output
    assert "horovod          site" in listing
    assert f"shadows builtin: {builtin_dir() / 'horovod.sbatch.j2'}" in listing


def test_show_prints_the_resolved_source(site):
    assert invoke("templates", "show", "horovod").output == \
        (builtin_dir() / "horovod.sbatch.j2").read_text()


def test_eject_copies_and_refuses_to_overwrite(site, tmp_path):
    result = invoke("templates", "eject", "horovod", "--to", str(site / "templates"))
    target = site / "templates" / "horovod.sbatch.j2"
    assert result.exit_code == 0 and target.read_text() == (builtin_dir() / "horovod.sbatch.j2").read_text()
    again = invoke("templates", "eject", "horovod", "--to", str(site / "templates"))
    assert again.exit_code == 2 and "already exists; use --force" in again.output
    assert invoke("templates", "eject", "horovd").exit_code == 2


def test_eject_default_goes_to_project(site, tmp_path):
    invoke("templates", "eject", "horovod")
    assert (tmp_path / ".hpcsuite" / "templates" / "horovod.sbatch.j2").is_file()


def test_validate_reports_file_and_line(site, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block setup %}\n'
        "echo {{ job.resources.nodez }}\n{% endblock %}\n")
    result = invoke("templates", "validate", str(bad))
    assert result.exit_code == 2
    assert f"{bad / 'horovod.sbatch.j2'}:3: undefined variable" in result.output
    # The template's error once, not once per example spec (issue T, point 8).
    assert result.output.count("undefined variable") == 1, result.output
    assert re.search(r"\(rendering [\w-]+\.yaml and \d+ other example specs\)", result.output)


def test_validate_ok(site):
    (site / "templates" / "horovod.sbatch.j2").write_text(EXTENDS)
    result = invoke("templates", "validate")
    assert result.exit_code == 0 and "ok: 1 template(s)" in result.output


def test_self_extension_is_a_clear_error(site):
    (site / "templates" / "horovod.sbatch.j2").write_text('{% extends "horovod.sbatch.j2" %}\n')
    result = invoke("render", QUICK)
    assert result.exit_code == 2 and 'extends "builtin/horovod.sbatch.j2"' in result.output


def test_template_dir_option_wins(site, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "horovod.sbatch.j2").write_text("#!/bin/bash\necho {{ job.name }}\n")
    (site / "templates" / "horovod.sbatch.j2").write_text(EXTENDS)
    assert invoke("render", QUICK, "--template-dir", str(mine)).stdout == "#!/bin/bash\necho quickstart\n"
