"""What changed in Slurm after 22.05 (hpcsuite.submit.slurm_rules), each rule tried on scripts
hpcsuite renders and on the recorded `sbatch --version` / `scontrol show config` of every
release from 22.05 to 26.05 (tests/data/slurm: 22.05.8 recorded on the local cluster, the
others derived from it and Slurm's source, as tests/data/slurm/derive.py says)."""

import dataclasses
from pathlib import Path

import pytest

from conftest import REPO
from hpcsuite.runner.against_slurm import rendered, rule_findings
from hpcsuite.site.horovod_mpi import mpi_identity
from hpcsuite.site.slurm_versions import judge_mpi, judge_slurm
from hpcsuite.submit.config import resolve
from hpcsuite.submit.slurm_rules import facts_from, parse_version, script_hits

DATA = Path(__file__).parent / "data"
RELEASES = sorted((p.name for p in (DATA / "slurm").iterdir() if p.is_dir()),
                  key=lambda v: tuple(int(x) for x in v.split(".")))


def facts(release):
    d = DATA / "slurm" / release
    return facts_from((d / "sbatch-version.txt").read_text(),
                      (d / "scontrol-show-config.txt").read_text())


def test_every_release_from_22_05_to_26_05_is_recorded():
    assert [r.rsplit(".", 1)[0] for r in RELEASES] == [
        "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05"]


@pytest.mark.parametrize("release", RELEASES)
def test_the_version_and_config_are_read_from_the_recorded_output(release):
    f = facts(release)
    assert f.client == f.server == tuple(int(x) for x in release.split("."))
    assert f.config["PreemptMode"] in ("OFF", "REQUEUE")
    assert f.config["MpiDefault"] == "none" and f.config["PMIxTimeout"] == "300"
    share = f.config.get("PMIxShareServerTopology")
    assert (share is not None) == (f.server >= (25, 11, 0)), share


def test_versions_as_each_build_prints_them():
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5, 8)        # Debian's
    assert parse_version("slurm 25.11.2") == (25, 11, 2)
    assert parse_version("sbatch: error: resolve_ctls_from_dns_srv") is None
    with pytest.raises(Exception, match="sbatch --version says no Slurm version"):
        facts_from("sbatch: fatal: Could not establish a configuration source", "")


# --- each rule on a script hpcsuite renders: the spec's keys that write the line it reads

PROFILE = """
python: python3
partitions:
  debug: {cpus_per_node: 64}
  gpu: {cpus_per_node: 64, gpus_per_node: 4}
sbatch_allowed: [oversubscribe, cpus-per-gpu, hint, cores-per-socket]
"""
SPEC = """
name: rules
launcher: srun
resources: {nodes: 2, tasks_per_node: 2, cpus_per_task: 2, partition: debug, time: "00:10:00"}
train: {backend: torch, model: mlp, data: {kind: synthetic, samples: 64, shape: [8]}}
"""

# rule -> (sets on SPEC, #SBATCH lines a site's template adds for options hpcsuite itself
# writes or refuses, the first recorded release it fires on, later releases on which the
# recorded site's settings keep it quiet)
CASES = {
    "exclusive-and-oversubscribe": (["resources.exclusive=true",
                                     "resources.extra_sbatch.oversubscribe=true"], [], "23.02.7", ()),
    "constraint-counts-outside-brackets": (["resources.constraint=skylake*1&ib*2"], [],
                                           "23.02.7", ()),
    "cpus-per-gpu-and-cpus-per-task": (["resources.extra_sbatch.cpus-per-gpu=4"], [], "23.11.10", ()),
    "export-file-removed": ([], ["--export-file=/etc/site/job.env"], "23.11.10", ()),
    "mpirun-cpus-per-task": (["launcher=mpirun"], [], "23.11.10", ()),
    "cpu-bind-rank": (["resources.binding.cpu_bind=rank"], [], "24.11.5", ()),
    # the controller refuses R: only while PreemptMode is OFF (26.05.3's site preempts)
    "signal-R-without-preemption": ([], ["--signal=R:USR1@60"], "24.11.5", ("26.05.3",)),
    # 26.05.3's site sets PMIxShareServerTopology=yes
    "pmix-topology": ([], [], "25.11.2", ("26.05.3",)),
    "hint-with-layout": (["resources.extra_sbatch.hint=compute_bound",
                          "resources.extra_sbatch.cores-per-socket=8"], [], "25.11.2", ()),
    "gres-and-gpus-per-node": (["resources.partition=gpu", "resources.gpus_per_node=2"],
                               ["--gres=gpu:2"], "26.05.3", ()),
}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """The site profile, in the site directory whose templates/ the tests' site template is."""
    path = tmp_path_factory.mktemp("site") / "profile.yaml"
    path.write_text(PROFILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HPCSUITE_SITE_DIR", str(path.parent))
        yield str(path)


def script_of(tmp_path, profile, sets, header=()):
    """The script hpcsuite renders for SPEC with ``sets``; ``header``: #SBATCH lines a site's
    template adds after hpcsuite's own."""
    spec = tmp_path / "rules.yaml"
    spec.write_text(SPEC)
    if header:                         # the site's own template (a user's adds none of these)
        templates = Path(profile).parent / "templates"
        templates.mkdir(parents=True, exist_ok=True)
        (templates / "legacy.sbatch.j2").write_text(
            '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
            + "".join(f"#SBATCH {line}\n" for line in header) + "{% endblock %}\n")
        sets = [*sets, "template=legacy"]
    r = resolve(str(spec), profile, sets, cwd=tmp_path, ambient=False)
    return rendered(r, cwd=tmp_path)[r.job.launcher]


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_fires_from_its_release_on_and_never_before(rule, tmp_path, profile):
    sets, header, first, quiet = CASES[rule]
    script = script_of(tmp_path, profile, sets, header)
    fired = [r for r in RELEASES if any(h.rule == rule for h in script_hits(script, facts(r)))]
    expected = [r for r in RELEASES[RELEASES.index(first):] if r not in quiet]
    assert fired == expected, (rule, fired)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_says_the_line_the_release_and_what_to_write(rule, tmp_path, profile):
    sets, header, first, _ = CASES[rule]
    script = script_of(tmp_path, profile, sets, header)
    hit = next(h for h in script_hits(script, facts(first)) if h.rule == rule)
    line = script.split("\n")[hit.line - 1]
    assert hit.text == line.strip() and hit.text
    said = hit.sentence(first)
    assert said.startswith(f"script line {hit.line} {hit.text!r}: ")
    assert f"(Slurm {hit.since} and later; this Slurm is {first})" in said
    assert hit.instead and hit.instead in said
    assert hit.level in ("error", "warning")


def test_hpcsuites_own_scripts_are_never_refused_and_a_plain_job_meets_no_rule(tmp_path, profile):
    """No golden script hpcsuite ships (Open MPI 4 and 5, MPICH, Intel MPI, containers) is
    refused by any release from 22.05 to 26.05; the default job (one rank per node) under
    both launchers meets no rule at all. Warnings stay possible: a golden with several ranks
    per node under pmix is slower to start on 25.11."""
    spec = tmp_path / "rules.yaml"
    spec.write_text(SPEC.replace("tasks_per_node: 2", "tasks_per_node: 1"))
    plain = rendered(resolve(str(spec), profile, (), ambient=False), ("srun", "mpirun"))
    goldens = {p.name: p.read_text() for p in (REPO / "sbatch").glob("*.sbatch")}
    assert len(goldens) >= 10
    for release in RELEASES:
        f = facts(release)
        assert not {(n, h.rule) for n, text in goldens.items() for h in script_hits(text, f)
                    if h.level == "error"}, release
        assert not {(n, h.rule) for n, text in plain.items() for h in script_hits(text, f)}


def test_the_signal_rule_came_with_24_11_1_not_24_11_0(tmp_path, profile):
    """Reading the source corrected the issue's claim: the controller refuses --signal=R: with
    PreemptMode=OFF from 24.11.1 (commit 7d6bd37bd4, cherry-picked), not 24.11.0."""
    script = script_of(tmp_path, profile, [], ["--signal=R:USR1@60"])
    f = facts("24.11.5")
    older = dataclasses.replace(f, client=(24, 11, 0), server=(24, 11, 0))
    assert [h.rule for h in script_hits(script, f)] == ["signal-R-without-preemption"]
    assert script_hits(script, older) == []
    # hpcsuite's own warning signal is B: (the batch shell), never refused
    own = script_of(tmp_path, profile, ["train.checkpoint.every_steps=10",
                                        "train.preemption.lead_seconds=60"])
    assert "#SBATCH --signal=B:USR1@60" in own and script_hits(own, f) == []


def test_node_counts_are_refused_outside_brackets_only(tmp_path, profile):
    f = facts("23.02.7")
    for fine in ("skylake*2", "[skylake*1&ib*2]", "skylake&ib", "[rack1|rack2]"):
        script = script_of(tmp_path, profile, [f'resources.constraint="{fine}"'])
        assert script_hits(script, f) == [], fine
    script = script_of(tmp_path, profile, ["resources.constraint=skylake*1&ib*2"])
    [hit] = script_hits(script, f)
    assert hit.text == "#SBATCH --constraint=skylake*1&ib*2"
    assert hit.instead.startswith('write resources.constraint: "[skylake*1&ib*2]"')


def test_the_mpirun_rule_needs_a_cgroup_site_and_two_ranks_a_node(tmp_path, profile):
    script = script_of(tmp_path, profile, ["launcher=mpirun"])
    f = facts("23.11.10")
    assert [h.rule for h in script_hits(script, f)] == ["mpirun-cpus-per-task"]
    hit = script_hits(script, f)[0]
    assert hit.text.startswith("mpirun -np 4 -npernode 2") and "SLURM_CPUS_PER_TASK=2" in hit.message
    no_cgroup = dataclasses.replace(f, config={**f.config, "TaskPlugin": "task/affinity"})
    assert script_hits(script, no_cgroup) == []
    one = script_of(tmp_path, profile, ["launcher=mpirun", "resources.tasks_per_node=1"])
    assert script_hits(one, f) == []
    assert "plm_slurm_args: --external-launcher" in hit.instead
    site = tmp_path / "external.yaml"
    site.write_text(PROFILE + "mpi: {mca: {plm_slurm_args: --external-launcher}}\n")
    fixed = script_of(tmp_path, str(site), ["launcher=mpirun"])
    assert "--mca plm_slurm_args --external-launcher" in fixed
    assert script_hits(fixed, f) == []


def test_rule_findings_are_lint_findings_with_the_job_key(tmp_path, profile):
    script = script_of(tmp_path, profile, ["resources.binding.cpu_bind=rank"])
    [f] = rule_findings(script, facts("24.11.5"))
    assert (f.level, f.key) == ("warning", "resources.binding.cpu_bind")
    assert "--cpu-bind=rank" in f.message and "Slurm 24.11.0 and later" in f.message
    assert "write cpu_bind: cores" in f.message
    assert rule_findings(script, facts("24.05.8")) == []


# --- doctor's judges on the same recorded output

def recorded(release):
    d = DATA / "slurm" / release
    return (0, (d / "sbatch-version.txt").read_text()), \
        (0, (d / "scontrol-show-config.txt").read_text())


def test_doctor_says_the_slurm_version_and_passes_a_clean_profile(tmp_path, profile):
    spec = tmp_path / "rules.yaml"
    spec.write_text(SPEC.replace("tasks_per_node: 2", "tasks_per_node: 1"))
    scripts = rendered(resolve(str(spec), profile, (), ambient=False), ("srun", "mpirun"))
    status, detail, hint = judge_slurm(*recorded("22.05.8"), scripts)
    assert status == "pass", detail
    assert detail.startswith("Slurm 22.05.8; PreemptMode OFF, TaskPlugin task/none, MpiDefault none")
    assert detail.endswith("the profile's scripts (mpirun, srun): no rule of Slurm 23.02-26.05 fires")


def test_doctor_warns_of_pmix_topology_on_25_11_whatever_the_scripts():
    status, detail, hint = judge_slurm(*recorded("25.11.2"), {})
    assert status == "warn" and "PMIX_LOCAL_TOPO" in detail and "PMIxShareServerTopology=true" in detail
    assert judge_slurm(*recorded("26.05.3"), {})[0] == "pass"     # that site shares it
    assert judge_slurm(*recorded("25.05.5"), {})[0] == "pass"


def test_doctor_fails_on_a_rule_that_refuses_the_profiles_script(tmp_path, profile):
    script = script_of(tmp_path, profile, [], ["--export-file=/etc/site/job.env"])
    status, detail, hint = judge_slurm(*recorded("23.11.10"), {"srun": script})
    assert status == "fail" and "srun job: script line" in detail and "--export-file" in detail
    assert hint.startswith("put the variables in the job's env")
    assert judge_slurm(*recorded("23.02.7"), {"srun": script})[0] == "pass"


def test_doctor_says_what_an_unanswering_slurm_printed():
    status, detail, _ = judge_slurm((1, "sbatch: fatal: Could not establish a configuration "
                                        "source"), (0, ""), {})
    assert status == "fail" and detail.startswith("sbatch --version: sbatch: fatal")


# --- MPI family and version, from each launcher's recorded --version

MPIS = {"openmpi-4.1.4.txt": ("openmpi", "4.1.4", "openmpi", "Open MPI 4.1.4 (mpirun --version)"),
        "openmpi-5.0.11.txt": ("openmpi", "5.0.11", "openmpi5", "Open MPI 5.0.11 (mpirun --version)"),
        "mpich-5.0.2.txt": ("mpich", "5.0.2", "mpich", "MPICH 5.0.2 (mpiexec --version)"),
        "intelmpi-2021.19.0.txt": ("intelmpi", "2021.19.0", "intelmpi",
                                   "Intel MPI 2021.19.0 (mpiexec --version)")}


@pytest.mark.parametrize("name", sorted(MPIS))
def test_the_mpi_family_and_version_from_each_launcher(name):
    family, version, flavour, detail = MPIS[name]
    text = (DATA / "mpi" / name).read_text()
    assert mpi_identity(text) == (family, version)
    assert judge_mpi(0, text, flavour) == ("pass", detail, "")
    other = "mpich" if flavour != "mpich" else "openmpi"
    status, said, hint = judge_mpi(0, text, other)
    assert status == "fail" and f"the profile's mpi.flavour is {other}" in said and hint


def test_an_open_mpi_4_under_the_openmpi5_flavour_fails():
    text = (DATA / "mpi" / "openmpi-4.1.4.txt").read_text()
    assert judge_mpi(0, text, "openmpi5")[0] == "fail"
    assert judge_mpi(127, "", "mpich")[1] == "mpiexec exit 127"


# --- the commands: lint --slurm and submit ask Slurm (faked here with the recorded answers)

def fake_slurm(release, monkeypatch, submitted):
    from hpcsuite import slurm

    d = DATA / "slurm" / release

    def call(argv, **kw):
        if argv[:2] == ["sbatch", "--version"]:
            return slurm.Completed(argv, 0, (d / "sbatch-version.txt").read_text(), "")
        if argv[:3] == ["scontrol", "show", "config"]:
            return slurm.Completed(argv, 0, (d / "scontrol-show-config.txt").read_text(), "")
        if argv[:3] == ["scontrol", "show", "partition"]:
            return slurm.Completed(argv, 0, "PartitionName=debug Default=YES MaxNodes=UNLIMITED\n", "")
        if argv[0] == "sinfo":
            return slurm.Completed(argv, 0, "node1|64|(null)\nnode2|64|(null)\n", "")
        if argv[0] == "sbatch":
            submitted.append(argv)
            return slurm.Completed(argv, 0, "4242\n", "")
        raise AssertionError(f"unexpected {argv}")

    monkeypatch.setattr(slurm, "call", call)


def test_lint_and_submit_apply_the_release_they_meet(tmp_path, profile, monkeypatch):
    from click.testing import CliRunner

    from hpcsuite.cli import main

    monkeypatch.chdir(tmp_path)
    script_of(tmp_path, profile, [], ["--signal=R:USR1@60"])       # writes the site's template
    spec = tmp_path / "legacy.yaml"
    spec.write_text(SPEC.replace("launcher: srun", "launcher: srun\ntemplate: legacy"))
    submitted = []
    fake_slurm("24.05.8", monkeypatch, submitted)
    result = CliRunner().invoke(main, ["lint", str(spec), "--profile", profile, "--slurm"])
    assert result.exit_code == 0 and result.stdout.strip() == f"{spec}: ok", result.output
    fake_slurm("24.11.5", monkeypatch, submitted)
    result = CliRunner().invoke(main, ["lint", str(spec), "--profile", profile, "--slurm"])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {spec}: template: script line ")
    assert "'#SBATCH --signal=R:USR1@60'" in line and "(Slurm 24.11.1 and later; this Slurm " \
        "is 24.11.5)" in line and "drop the R:" in line
    # submit refuses it before sbatch, in the same words; 26.05.3's site preempts: submitted
    result = CliRunner().invoke(main, ["submit", str(spec), "--profile", profile])
    assert result.exit_code == 2 and "--signal=R:USR1@60" in result.stderr and not submitted
    fake_slurm("26.05.3", monkeypatch, submitted)
    result = CliRunner().invoke(main, ["submit", str(spec), "--profile", profile])
    assert result.exit_code == 0 and result.stdout.strip().splitlines()[-1] == "4242", result.output
    assert len(submitted) == 1
