"""End to end on the local Slurm cluster: sbatch obeys what hpcsuite's reader of the #SBATCH
header says it will, and a site's locks hold against hostile specs, templates and settings.

The cluster has two partitions, ``debug`` (default) and ``other``: a smuggled option shows up
as a job in ``other``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcsuite.submit.sbatch_header import HeaderError, parse_header

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PIECES = ["--job-name=", "--comment=", " --comment=", " -p", " -pother", " --partition=other",
          " --part=debug", "'", '"', "\\", " ", "#", "a", "b", "\t", "x y", " -J", " --comment ",
          "\\ ", "''", '""', " hetjob", " packjob", "\\'' --partition=other #'"]


def sbatch_reads(env, work, script: str):
    """What the real sbatch makes of ``script``: (job name, comment, partition) or "error"."""
    path = work / "probe.sbatch"
    path.write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", "--hold", str(path)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return "error"
    job = proc.stdout.strip().split(";")[0]
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%j\x1f%k\x1f%P"], env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        subprocess.run(["scancel", job], env=env, timeout=60)
    name, comment, partition = out.split("\n")[0].split("\x1f")
    return name, (None if comment == "(null)" else comment), partition


def reader_predicts(script: str):
    try:
        found = {o.name: o.value for o in parse_header(script)}
    except HeaderError as e:
        # hpcsuite submits one job: it refuses a heterogeneous-job separator that sbatch
        # would act on, so there is nothing to compare.
        return "hetjob" if "heterogeneous" in str(e) else "error"
    partition = found.get("partition") or "debug"
    if partition not in ("debug", "other"):
        return "error"   # a word sbatch read as a partition the cluster does not have
    return found.get("job-name"), found.get("comment"), partition


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("probe")


# 150 derandomised probes in make test-full, 30 in CI's tier (HPCSUITE_LOCK_PROBES)
@settings(max_examples=int(os.environ.get("HPCSUITE_LOCK_PROBES", "150")), deadline=None,
          derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(line=st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join))
def test_reader_agrees_with_real_sbatch(local_cluster, probe_dir, line):
    cluster, env = local_cluster
    script = f"#!/bin/bash\n#SBATCH --job-name=base --comment=base\n#SBATCH {line}\ntrue\n"
    predicted = reader_predicts(script)
    if predicted != "hetjob":
        assert predicted == sbatch_reads(env, probe_dir, script), line


def test_the_quoting_hole_is_real_and_closed(local_cluster, tmp_path):
    """A shell-quoted value carried --partition=other past the header on the old main; sbatch
    still obeys such a line, and hpcsuite no longer writes one."""
    cluster, env = local_cluster
    import shlex

    value = "\\'' --partition=other #'"
    old_style = (f"#!/bin/bash\n#SBATCH --job-name=old\n#SBATCH --partition=debug\n"
                 f"#SBATCH --output={shlex.quote(value + '/old/slurm-%j.out')}\ntrue\n")
    assert sbatch_reads(env, tmp_path, old_style)[2] == "other"
    assert reader_predicts(old_style)[2] == "other"

    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: hostile\noutput_dir: {json.dumps(value)}\n")
    proc = run_cli("submit", str(spec), cwd=tmp_path, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {spec}: output_dir: ")
    assert "Traceback" not in proc.stderr


@pytest.fixture
def locked_site(tmp_path, local_cluster):
    cluster, env = local_cluster
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    (site / "profile.yaml").write_text(textwrap.dedent("""\
        name: localsite
        contact: hpc-admins@localsite.example
        partitions: {debug: {cpus_per_node: 1, max_time: "01:00:00"}, other: {cpus_per_node: 1}}
        defaults: {resources: {partition: debug}}
        locked: [resources.partition]
        """))
    work = tmp_path / "user"
    (work / ".hpcsuite" / "templates").mkdir(parents=True)
    env = dict(env, HPCSUITE_SITE_DIR=str(site), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    env.pop("HPCSUITE_PROFILE", None)
    spec = work / "job.yaml"
    spec.write_text("name: lockjob\nresources: {nodes: 1}\ntrain: {data: {samples: 256}, epochs: 1}\n")
    return env, site, work, spec


def jobs_in_queue(env) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %P %j"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.split("\n")[:-1]


@pytest.mark.parametrize("smuggle, said", [
    ("#SBATCH --chdir=/tmp", "--chdir is not allowed here (run directories are relative to the "
                             "submit directory; sbatch_allowed cannot allow it)"),
    ("#SBATCH --reservation=maint", "--reservation is not allowed here (the job does not ask for "
                                    "it and the site's sbatch_allowed does not list it"),
    ("#SBATCH --qos=high", "--qos is not allowed here (hpcsuite writes it from resources.qos"),
])
def test_a_project_template_adds_no_option_the_job_did_not_ask_for(locked_site, smuggle, said):
    """Issue 51, point 2: refused at submit, before sbatch (`--chdir=/tmp` gave a job "killed
    by signal 53"); nothing queued, no run directory."""
    env, site, work, spec = locked_site
    stderr = refused_submit(env, work, spec, smuggle)
    assert f"horovod.sbatch.j2 (rendered):" in stderr and said in stderr, stderr


def refused_submit(env, work, spec, smuggle: str) -> str:
    """Submit with a project template that adds ``smuggle`` to the header: exit 2 with one
    line, nothing queued, no run directory; that line."""
    (work / ".hpcsuite" / "templates" / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
        + smuggle + "\n{% endblock %}\n")
    before = jobs_in_queue(env)
    proc = run_cli("submit", str(spec), cwd=work, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    # a job an earlier test left finishing may leave the queue meanwhile: no new job is the bar
    assert set(jobs_in_queue(env)) <= set(before) and not (work / "runs").exists()
    return proc.stderr


@pytest.mark.parametrize("smuggle", [
    "#SBATCH --partition=other",
    "#SBATCH -J x -pother",
    "#SBATCH --comment=x --part=other",
])
def test_a_project_template_cannot_move_a_locked_job(locked_site, smuggle):
    env, site, work, spec = locked_site
    assert "#SBATCH --partition must be 'debug' (the site locks resources.partition)" in \
        refused_submit(env, work, spec, smuggle)


def test_without_the_lock_sbatch_obeys_the_template(locked_site):
    """The control: the same template on a site that locks nothing moves the job, so the
    refusal above is what kept it in place. (The job asks for a partition, the site's default:
    a user's template may change what the job asks for where nothing is locked, never add an
    option it does not ask for.)"""
    env, site, work, spec = locked_site
    (site / "profile.yaml").write_text("partitions: {debug: {cpus_per_node: 1}, other: {cpus_per_node: 1}}\n"
                                       "defaults: {resources: {partition: debug}}\n")
    (work / ".hpcsuite" / "templates" / "horovod.sbatch.j2").write_text(
        '{% extends "builtin/horovod.sbatch.j2" %}\n{% block sbatch %}{{ super() }}'
        "#SBATCH -J x -pother\n{% endblock %}\n")
    proc = run_cli("submit", str(spec), cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    try:
        line = next(l for l in jobs_in_queue(env) if l.split()[0] == job)
        assert line.split()[1] == "other"
    finally:
        subprocess.run(["scancel", job], env=env, timeout=60)


PINNED_MAIN = ("import sys, pathlib, hpcsuite.submit.config as c; c.SYSTEM_DIR = pathlib.Path(sys.argv.pop(1)); "
               "from hpcsuite.cli import main; sys.argv[0] = 'hpcsuite'; main()")


def test_pinned_site_profile_holds_and_the_job_runs(locked_site, tmp_path):
    """A site pins its profile (here the pinned directory stands in for /etc/hpcsuite):
    neither --profile, HPCSUITE_PROFILE nor HPCSUITE_SITE_DIR replaces it, a user profile
    cannot redefine the partition's limits, and the job runs where the site says."""
    env, site, work, spec = locked_site
    pinned = tmp_path / "etc-hpcsuite"
    pinned.mkdir()
    (pinned / "profile.yaml").write_text((site / "profile.yaml").read_text() + "pinned: true\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("partitions: {other: {cpus_per_node: 1}}\n")

    def hpcsuite(*args, extra_env=None):
        return subprocess.run([sys.executable, "-c", PINNED_MAIN, str(pinned), *args], cwd=work,
                              env={**env, **(extra_env or {})}, capture_output=True, text=True,
                              timeout=600)

    env.pop("HPCSUITE_SITE_DIR")
    for args, extra in [(["--profile", str(mine)], None), ([], {"HPCSUITE_PROFILE": str(mine)}),
                        ([], {"HPCSUITE_SITE_DIR": str(tmp_path)})]:
        proc = hpcsuite("submit", str(spec), *args, extra_env=extra)
        assert proc.returncode == 2 and "this site pins its profile" in proc.stderr, proc.stderr
    (tmp_path / "xdg" / "hpcsuite").mkdir(parents=True)
    (tmp_path / "xdg" / "hpcsuite" / "profile.yaml").write_text(
        "partitions: {debug: {max_time: '7-00:00:00'}}\n")
    proc = hpcsuite("submit", str(spec))
    assert proc.returncode == 2 and "only the site profile" in proc.stderr
    (tmp_path / "xdg" / "hpcsuite" / "profile.yaml").unlink()

    proc = hpcsuite("submit", str(spec), "--wait", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["state"] == "COMPLETED"
    script = (work / "runs" / "lockjob" / payload["job_id"] / "job.sbatch").read_text()
    assert "#SBATCH --partition=debug\n" in script
