"""pinned: true pins /etc/hpcsuite/profile.yaml only: elsewhere config show, lint and doctor
say it does nothing (issue 51, point 6)."""

import pytest
from click.testing import CliRunner

import hpcsuite.submit.config as config
from hpcsuite.cli import main
from hpcsuite.site import doctor
from hpcsuite.submit.config import resolve
from hpcsuite.submit.pinning import pinned_in_vain
from hpcsuite.submit.site_profile import SiteProfile

SITE = """\
pinned: true
name: uni
partitions:
  batch: {cpus_per_node: 8}
  other: {cpus_per_node: 8}
defaults: {resources: {partition: batch}}
locked: [resources.partition]
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site directory through HPCSUITE_SITE_DIR whose profile says pinned: true, a job, and
    a stand-in for /etc/hpcsuite that holds nothing."""
    for d in ("site", "xdg", "work"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("HPCSUITE_SITE_DIR", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCSUITE_PROFILE", raising=False)
    monkeypatch.setattr(config, "SYSTEM_DIR", tmp_path / "etc")
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "site" / "profile.yaml").write_text(SITE)
    spec = tmp_path / "work" / "job.yaml"
    spec.write_text("name: job\n")
    return {"profile": tmp_path / "site" / "profile.yaml", "spec": spec,
            "system": tmp_path / "etc" / "profile.yaml", "tmp": tmp_path}


def said(path, system):
    return (f"{path} says pinned: true, which takes effect only in {system}: a user's --profile, "
            f"HPCSUITE_PROFILE or HPCSUITE_SITE_DIR still replaces this profile; install it as "
            f"{system} to pin it, or remove pinned: true")


def test_outside_etc_pinned_does_nothing_a_users_profile_replaces_it(site):
    """What the warnings are about: the profile says pinned, and --profile replaces it."""
    mine = site["tmp"] / "mine.yaml"
    mine.write_text("defaults: {resources: {partition: other}}\n")
    assert resolve(str(site["spec"]), str(mine)).job.resources.partition == "other"


def test_config_show_warns_and_does_not_mark_pinned_locked(site):
    result = CliRunner().invoke(main, ["config", "show", "--origin"])
    assert result.exit_code == 0, result.output
    assert f"warning: {said(site['profile'], site['system'])}\n" in result.stderr
    lines = {l.split()[0]: l for l in result.stdout.splitlines()}
    assert lines["site.pinned"].endswith(f"[no effect: only {site['system']} is pinned]")
    assert "[locked]" not in lines["site.pinned"]
    assert lines["job.resources.partition"].endswith("[locked]")     # a real lock still is


def test_config_show_yaml_says_pinned_has_no_effect(site):
    result = CliRunner().invoke(main, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert f"  pinned: true  # no effect: only {site['system']} is pinned\n" in result.stdout
    assert "warning: " in result.stderr


def test_config_show_warns_of_a_profile_given_with_profile_or_its_variable(site, monkeypatch):
    monkeypatch.delenv("HPCSUITE_SITE_DIR")
    given = site["tmp"] / "given.yaml"
    given.write_text(SITE)
    result = CliRunner().invoke(main, ["config", "show", "--profile", str(given)])
    assert f"warning: {said(given, site['system'])}\n" in result.stderr
    result = CliRunner().invoke(main, ["config", "show"], env={"HPCSUITE_PROFILE": str(given)})
    assert f"warning: {said(given, site['system'])}\n" in result.stderr


def test_lint_warns(site):
    result = CliRunner().invoke(main, ["lint", "--no-slurm", str(site["spec"])])
    assert result.exit_code == 0, result.output
    assert f"warning: {site['spec']}: pinned: {said(site['profile'], site['system'])}\n" \
        in result.stderr


def test_doctor_warns_first_in_its_own_format(site):
    check = doctor.check_pinned(pinned_in_vain())
    assert check == doctor.Check("profile", doctor.WARN, said(site["profile"], site["system"])
                                 .split("; install")[0], f"install it as {site['system']} to "
                                 "pin it, or remove pinned: true")
    text = doctor.report([check])
    assert text.startswith(f"WARN profile     {site['profile']} says pinned: true")
    assert f"-> install it as {site['system']}" in text


def test_doctor_command_passes_the_warning_to_its_checks(site, monkeypatch):
    """The command asks :func:`pinned_in_vain` and run_checks reports it before Slurm's
    checks (Slurm itself is not asked here: test_e2e_doctor runs the real checks)."""
    quick = doctor.Check("x", doctor.PASS, "ok")
    for name in ("check_slurm", "check_accounting", "check_mpi", "check_infiniband", "check_gpus",
                 "check_slurm_rules", "check_pmi", "check_network", "check_fabric"):
        monkeypatch.setattr(doctor, name, lambda *a, **k: quick)
    monkeypatch.setattr(doctor, "check_horovod", lambda *a, **k: quick)
    monkeypatch.setattr(doctor, "horovod_build", lambda *a, **k: {})
    monkeypatch.setattr(doctor.horovod_mpi, "check", lambda *a, **k: ("pass", "ok", ""))
    result = CliRunner().invoke(main, ["doctor", "--no-compute"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"WARN profile     {site['profile']} says pinned: true")
    assert "1 warnings" in result.stdout


def test_the_pinned_system_profile_and_an_unpinned_one_say_nothing(site, monkeypatch):
    site["profile"].write_text(SITE.replace("pinned: true\n", ""))
    assert pinned_in_vain() is None
    result = CliRunner().invoke(main, ["config", "show", "--origin"])
    assert "warning" not in result.stderr and "no effect" not in result.stdout
    result = CliRunner().invoke(main, ["lint", "--no-slurm", str(site["spec"])])
    assert "pinned" not in result.stderr
    site["system"].parent.mkdir()
    site["system"].write_text(SITE)
    monkeypatch.delenv("HPCSUITE_SITE_DIR")
    assert pinned_in_vain() is None and doctor.check_pinned(pinned_in_vain()) is None
    result = CliRunner().invoke(main, ["config", "show", "--origin"])
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    assert {l.split()[0]: l for l in result.stdout.splitlines()}["site.pinned"].endswith("[locked]")
