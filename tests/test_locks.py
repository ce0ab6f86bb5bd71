"""What a site locks holds at every layer: profiles, --set, templates, environment, pinning."""

import json

import pytest
from click.testing import CliRunner

import hpcsuite.submit.config as config
from hpcsuite.cli import main
from hpcsuite.submit.config import resolve
from hpcsuite.errors import UserError
from hpcsuite.submit.plan import plan
from hpcsuite.submit.templating import SearchPath

SITE = """\
name: uni
contact: hpc@uni.example
partitions:
  batch: {cpus_per_node: 8, max_time: "02:00:00", account: physics, qos: normal}
  other: {cpus_per_node: 8}
mpi: {mpirun_args: [--report-bindings]}
module_init: source /etc/profile.d/modules.sh
modules: [openmpi/4.1]
setup: ["export SITE_SETUP=1"]
defaults: {resources: {partition: batch}}
locked: [resources.partition]
"""


@pytest.fixture
def layers(tmp_path, monkeypatch):
    site, user, project = tmp_path / "site", tmp_path / "xdg", tmp_path / "proj"
    for d in (site / "templates", user / "hpcsuite", project / ".hpcsuite" / "templates"):
        d.mkdir(parents=True)
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.setattr(config, "SYSTEM_DIR", tmp_path / "etc-hpcsuite")
    monkeypatch.chdir(project)
    files = {"site": site / "profile.yaml", "user": user / "hpcsuite" / "profile.yaml",
             "project": project / ".hpcsuite" / "profile.yaml", "spec": project / "job.yaml",
             "templates": project / ".hpcsuite" / "templates", "system": tmp_path / "etc-hpcsuite"}
    files["site"].write_text(SITE)
    files["spec"].write_text("name: job\n")
    return files


def rendered(layers, *sets):
    r = resolve(str(layers["spec"]), sets=sets)
    return plan(r.job, r.profile, SearchPath.default(), r.locks).script


@pytest.mark.parametrize("layer", ["user", "project"])
@pytest.mark.parametrize("text, key", [
    ("partitions: {batch: {account: free}}", "partitions"),
    ("partitions: {batch: {max_time: '7-00:00:00'}}", "partitions"),
    ("mpi: {mpirun_args: [--oversubscribe]}", "mpi"),
    ("module_init: 'true'", "module_init"),
    ("contact: me@example.org", "contact"),
    ("allow_unlimited_time: true", "allow_unlimited_time"),
])
def test_user_and_project_profiles_cannot_redefine_the_cluster(layers, layer, text, key):
    layers[layer].write_text(text + "\n")
    with pytest.raises(UserError) as exc:
        resolve(str(layers["spec"]))
    assert str(exc.value).startswith(f"{layers[layer]}: {key}: only the site profile")


def test_without_a_site_profile_a_user_profile_describes_the_cluster(layers):
    layers["site"].unlink()
    layers["user"].write_text("partitions: {mine: {account: me}}\n")
    layers["spec"].write_text("name: job\nresources: {partition: mine}\n")
    assert "#SBATCH --account=me" in rendered(layers)


def test_site_setup_and_modules_always_run_user_lines_are_added(layers):
    layers["user"].write_text("modules: [python/3.11]\nsetup: ['export MINE=1']\n")
    layers["project"].write_text("modules: [openmpi/4.1]\nsetup: ['export PROJ=1']\n")
    r = resolve(str(layers["spec"]))
    assert r.profile.modules == ["openmpi/4.1", "python/3.11"]
    assert r.profile.setup == ["export SITE_SETUP=1", "export MINE=1", "export PROJ=1"]
    assert r.origins["site.setup"].startswith(f"site ({layers['site']}) + user (")


def test_site_may_lock_profile_keys_too(layers):
    layers["site"].write_text(SITE.replace("locked: [resources.partition]",
                                           "python: /opt/venv/bin/python\n"
                                           "locked: [resources.partition, site.python, site.setup]"))
    layers["user"].write_text("python: /home/me/venv/bin/python\n")
    with pytest.raises(UserError, match=r"python: the site fixes site.python"):
        resolve(str(layers["spec"]))
    layers["user"].write_text("setup: ['echo mine']\n")
    with pytest.raises(UserError, match=r"setup: the site fixes site.setup"):
        resolve(str(layers["spec"]))
    layers["user"].write_text("python: /opt/venv/bin/python\n")   # restating is fine
    assert resolve(str(layers["spec"])).profile.python == "/opt/venv/bin/python"


def test_bad_profile_lock_is_named(layers):
    layers["site"].write_text("locked: [site.pyhton]\n")
    with pytest.raises(UserError, match=r"locked\[0\]: 'site.pyhton' is not a site profile key "
                                        r'\(did you mean "python"\?\)'):
        resolve(str(layers["spec"]))


def test_partition_account_qos_and_time_limit_reach_the_header(layers):
    script = rendered(layers)
    assert "#SBATCH --partition=batch" in script and "#SBATCH --account=physics" in script
    assert "#SBATCH --qos=normal" in script


@pytest.mark.parametrize("block, message", [
    ("#SBATCH --partition=other", "--partition must be 'batch' (the site locks resources.partition)"),
    ("#SBATCH -p other", "--partition must be 'batch'"),
    ("#SBATCH --job-name=x --part=other", "--partition must be 'batch'"),
    ("#SBATCH --account=free", "--account must be 'physics' (the site profile sets it for partition batch)"),
    ("#SBATCH -q high", "--qos must be 'normal'"),
    ("#SBATCH --time=3:00:00", "is longer than partition batch allows (02:00:00)"),
    ("#SBATCH --time=0", "asks for no time limit"),
    ("#SBATCH --time=UNLIMITED", "is not a time hpcsuite can check"),
    ("#SBATCH --comment='a", "unmatched '"),
    ("#SBATCH hetjob\n#SBATCH -p other", "heterogeneous"),
])
def test_a_project_template_cannot_change_what_the_site_fixes(layers, block, message):
    (layers["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n'
        "{% block sbatch %}{{ super() }}" + block + "\n{% endblock %}\n")
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rendered(layers)


def test_a_template_that_drops_a_locked_option_is_refused(layers):
    (layers["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}\n'
        "#SBATCH --job-name={{ job.name }}\n{% endblock %}\n")
    with pytest.raises(UserError, match=r"--partition must be 'batch'.*missing"):
        rendered(layers)


def test_an_unlocked_option_a_template_changes_is_its_business(layers):
    (layers["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n'
        "{% block sbatch %}{{ super() }}#SBATCH --nodes=3\n{% endblock %}\n")
    assert "#SBATCH --nodes=3" in rendered(layers)


def test_locked_resources_subtree_fixes_every_resource_option(layers):
    layers["site"].write_text(SITE.replace("locked: [resources.partition]", "locked: [resources]"))
    (layers["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n'
        "{% block sbatch %}{{ super() }}#SBATCH --nodes=3\n{% endblock %}\n")
    with pytest.raises(UserError, match=r"--nodes must be '1' \(the site locks resources\)"):
        rendered(layers)


# ---------------------------------------------------------------------- pinning

def pin(layers):
    layers["system"].mkdir(exist_ok=True)
    (layers["system"] / "profile.yaml").write_text(SITE + "pinned: true\n")


def test_a_pinned_site_profile_cannot_be_swapped(layers, tmp_path, monkeypatch):
    pin(layers)
    mine = tmp_path / "mine.yaml"
    mine.write_text("partitions: {other: {}}\n")
    with pytest.raises(UserError, match=r"--profile/HPCSUITE_PROFILE: this site pins its profile"):
        resolve(str(layers["spec"]), str(mine))
    with pytest.raises(UserError, match=r"HPCSUITE_SITE_DIR: this site pins its profile"):
        resolve(str(layers["spec"]))
    monkeypatch.delenv("HPCSUITE_SITE_DIR")
    r = resolve(str(layers["spec"]))
    assert r.job.resources.partition == "batch"
    assert [l.source for l in r.layers if l.name == "site"] == [str(layers["system"] / "profile.yaml")]
    # ... and its templates directory is the pinned one.
    assert ("site", layers["system"] / "templates") in SearchPath.default().dirs


def test_pinned_cli_refuses_profile_option_with_exit_2(layers, tmp_path, monkeypatch):
    pin(layers)
    monkeypatch.delenv("HPCSUITE_SITE_DIR")
    mine = tmp_path / "mine.yaml"
    mine.write_text("{}\n")
    result = CliRunner().invoke(main, ["render", str(layers["spec"]), "--profile", str(mine)])
    assert result.exit_code == 2 and "this site pins its profile" in result.output
    result = CliRunner().invoke(main, ["render", str(layers["spec"])], env={"HPCSUITE_PROFILE": str(mine)})
    assert result.exit_code == 2 and "this site pins its profile" in result.output


# ---------------------------------------------------------------------- config show

def test_config_show_marks_locked_values(layers):
    result = CliRunner().invoke(main, ["config", "show", str(layers["spec"]), "--origin"])
    assert result.exit_code == 0, result.output
    lines = {l.split()[0]: l for l in result.output.splitlines()}
    assert lines["job.resources.partition"].endswith("[locked]")
    assert lines["site.partitions.batch.account"].endswith("[locked]")
    assert not lines["job.resources.nodes"].endswith("[locked]")
    assert not lines["site.modules"].endswith("[locked]")
    data = json.loads(CliRunner().invoke(main, ["config", "show", "--origin", "--json"]).output)
    assert "job.resources.partition" in data["locked"] and "job.train.lr" not in data["locked"]


def test_a_locked_template_is_the_site_one_whatever_shadows_it(layers, tmp_path):
    site_templates = layers["site"].parent / "templates"
    (site_templates / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n'
        "{% block setup %}echo site-template\n{{ super() }}{% endblock %}\n")
    (layers["templates"] / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n'
        "{% block setup %}echo project-template\n{% endblock %}\n")
    out = CliRunner().invoke(main, ["render", str(layers["spec"])]).output
    assert "echo project-template" in out            # unlocked: the project's file wins
    layers["site"].write_text(SITE.replace("locked: [resources.partition]",
                                           "locked: [resources.partition, template]"))
    out = CliRunner().invoke(main, ["render", str(layers["spec"])]).output
    assert "echo site-template" in out and "project-template" not in out
    result = CliRunner().invoke(main, ["render", str(layers["spec"]), "--template-dir",
                                       str(layers["templates"])])
    assert result.exit_code == 2 and "--template-dir: the site locks the template" in result.output
