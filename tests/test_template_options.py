"""A template adds no #SBATCH option the job did not ask for: a user's, a project's or a
--template-dir template only those the site lists in sbatch_allowed; any template none of
those that break a job under hpcsuite. And `templates which/show/list` name the template render
really uses when the site locks it."""

import pytest
from click.testing import CliRunner

import hpcsuite.submit.config as config
from hpcsuite.cli import main
from hpcsuite.submit.templating import builtin_dir

SITE = """\
name: uni
partitions:
  batch: {cpus_per_node: 8, max_time: "02:00:00"}
  fixed: {cpus_per_node: 8, qos: gpu, reservation: maint}
sbatch_allowed: [licenses]
defaults: {resources: {partition: batch}}
"""

PARENT = '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'


@pytest.fixture
def site(tmp_path, monkeypatch):
    dirs = {"site": tmp_path / "site", "user": tmp_path / "xdg" / "hpcsuite",
            "project": tmp_path / "proj" / ".hpcsuite", "cli": tmp_path / "mine"}
    for d in dirs.values():
        (d / "templates").mkdir(parents=True)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(dirs["site"]))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.setattr(config, "SYSTEM_DIR", tmp_path / "etc-hpcsuite")
    monkeypatch.chdir(tmp_path / "proj")
    (dirs["site"] / "profile.yaml").write_text(SITE)
    (tmp_path / "proj" / "job.yaml").write_text("name: job\n")
    return dirs


def template(directory, line: str) -> None:
    (directory / "templates" / "horovod.sbatch.j2").write_text(PARENT + line + "\n{% endblock %}\n")


def render(*args: str):
    result = CliRunner().invoke(main, ["render", "job.yaml", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def refusal(*args: str) -> str:
    """exit 2 and one `error:` line, nothing else: that line."""
    result = render(*args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# The options a user's or project's template passed to sbatch before (issue 51, point 2).
UNLISTED = ["--reservation=maint", "--clusters=other", "--nice=10", "--priority=100",
            "--deadline=now+1hour", "--time-min=00:10:00", "--hold"]
BREAKING = ["--chdir=/tmp", "--export=NONE", "--error=/tmp/err", "-D /tmp", "-e err.log"]


@pytest.mark.parametrize("layer", ["project", "user"])
@pytest.mark.parametrize("line", UNLISTED)
def test_a_users_template_adds_no_option_the_site_does_not_list(site, layer, line):
    template(site[layer], f"#SBATCH {line}")
    option = line.split("=")[0]
    error = refusal()
    assert f"horovod.sbatch.j2 (rendered):" in error and str(site[layer]) in error
    assert f"#SBATCH {option} is not allowed here (the job does not ask for it and the site's " \
           "sbatch_allowed does not list it (it lists: licenses)" in error


@pytest.mark.parametrize("line", BREAKING)
def test_options_that_break_a_job_are_refused_whatever_the_site_lists(site, line):
    (site["site"] / "profile.yaml").write_text(SITE.replace("[licenses]", "[licenses, wckey]"))
    template(site["project"], f"#SBATCH {line}")
    assert "sbatch_allowed cannot allow it" in refusal()
    template(site["cli"], f"#SBATCH {line}")
    assert "sbatch_allowed cannot allow it" in refusal("--template-dir", str(site["cli"] / "templates"))


def test_a_qos_on_a_partition_with_none_is_refused_and_a_fixed_one_must_match(site):
    template(site["project"], "#SBATCH --qos=high")
    assert "#SBATCH --qos is not allowed here (hpcsuite writes it from resources.qos, which " \
           "this job leaves unset; set that key in the spec instead)" in refusal()
    assert "#SBATCH --qos must be 'gpu' (the site profile sets it for partition fixed)" in \
        refusal("--set", "resources.partition=fixed")


def test_a_template_dir_is_held_to_the_same_list(site):
    template(site["cli"], "#SBATCH --reservation=maint")
    assert "#SBATCH --reservation is not allowed here" in refusal("--template-dir", str(site["cli"] / "templates"))


def test_what_the_site_lists_or_writes_itself_passes(site):
    template(site["project"], "#SBATCH --licenses=fluent:2")
    result = render()
    assert result.exit_code == 0, result.output
    assert "#SBATCH --licenses=fluent:2\n" in result.output
    (site["project"] / "templates" / "horovod.sbatch.j2").unlink()
    template(site["site"], "#SBATCH --reservation=maint")      # the site's own template
    result = render()
    assert result.exit_code == 0 and "#SBATCH --reservation=maint\n" in result.output, result.output
    # what the job asks for, written by a user's template, passes too
    template(site["project"], "#SBATCH --comment=note")
    result = render("--set", "resources.comment=note", "--set", "train.preemption.requeue=true",
                    "--set", "train.checkpoint.every_steps=5")
    assert result.exit_code == 0, result.output


def test_the_templates_commands_name_what_render_uses_under_a_locked_template(site):
    template(site["user"], "#SBATCH --licenses=a:1")
    template(site["project"], "#SBATCH --licenses=b:1")
    runner = CliRunner()
    assert runner.invoke(main, ["templates", "which", "horovod"]).output.strip() == \
        str(site["project"] / "templates" / "horovod.sbatch.j2")
    (site["site"] / "profile.yaml").write_text(SITE + "locked: [template]\n")
    which = runner.invoke(main, ["templates", "which", "horovod"])
    assert which.exit_code == 0 and which.output.strip() == str(builtin_dir() / "horovod.sbatch.j2")
    assert "b:1" not in runner.invoke(main, ["templates", "show", "horovod"]).output
    listed = runner.invoke(main, ["templates", "list"]).output
    assert "the site locks the template" in listed and str(site["user"]) not in listed
    # render uses the same file: the project's --licenses never reaches the script
    assert "--licenses" not in render().output
    template(site["site"], "#SBATCH --comment=site")
    assert runner.invoke(main, ["templates", "which", "horovod"]).output.strip() == \
        str(site["site"] / "templates" / "horovod.sbatch.j2")
    assert "#SBATCH --comment=site\n" in render().output
