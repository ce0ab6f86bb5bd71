"""End to end, as a sysadmin: eject the built-in template into a site directory, add a module
load and an environment variable, lock the partition; users render with the site's lines,
cannot change the partition, and their job still runs on the local Slurm cluster."""

import json

import pytest

from conftest import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SITE_LINES = """set -euo pipefail
# --- site additions ---
source /usr/share/modules/init/bash
module use {modulefiles}
module load site-tools
export SITE_MARKER=from-site-template
echo "site check: module=$HPCSUITE_SITE_MODULE marker=$SITE_MARKER"
"""


@pytest.fixture
def site(tmp_path, local_cluster):
    cluster, env = local_cluster
    site = tmp_path / "site"
    modulefiles = tmp_path / "modulefiles"
    modulefiles.mkdir()
    (modulefiles / "site-tools").write_text("#%Module1.0\nsetenv HPCSUITE_SITE_MODULE loaded\n")
    env = dict(env, HPCSUITE_SITE_DIR=str(site), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    env.pop("HPCSUITE_PROFILE", None)

    ejected = run_cli("templates", "eject", "horovod", "--to", str(site / "templates"), env=env,
                      check=True)
    template = site / "templates" / "horovod.sbatch.j2"
    assert ejected.stdout.strip() == f"wrote {template}"
    text = template.read_text()
    assert text.count("set -euo pipefail\n") == 1
    template.write_text(text.replace("set -euo pipefail\n", SITE_LINES.format(modulefiles=modulefiles)))
    (site / "profile.yaml").write_text(
        "name: localsite\ncontact: hpc-admins@localsite.example\n"
        "partitions: {debug: {cpus_per_node: 1, max_time: '01:00:00'}}\n"
        "defaults: {resources: {partition: debug}}\n"
        "locked: [resources.partition]\n")
    work = tmp_path / "user"
    work.mkdir()
    spec = work / "job.yaml"
    spec.write_text("name: sitejob\nresources: {nodes: 2, tasks_per_node: 1}\n"
                    "train: {data: {samples: 1024}, epochs: 1}\n")
    return env, site, spec, work


def test_site_template_and_lock(site):
    env, site_dir, spec, work = site
    # The user sees which template wins and the script carries the site's lines.
    which = run_cli("templates", "which", "horovod", env=env, check=True, cwd=work)
    assert which.stdout.strip() == str(site_dir / "templates" / "horovod.sbatch.j2")
    script = run_cli("render", str(spec), env=env, check=True, cwd=work).stdout
    assert "module load site-tools" in script and "export SITE_MARKER=from-site-template" in script
    assert "#SBATCH --partition=debug" in script
    assert run_cli("templates", "validate", env=env, cwd=work).returncode == 0

    # Changing the partition is refused, from the spec or from --set, with a one-line error.
    refused = run_cli("render", str(spec), "--set", "resources.partition=gpu", env=env, cwd=work)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"error: --set: resources.partition: the site fixes resources.partition "
        f"(in {site_dir / 'profile.yaml'}); talk to hpc-admins@localsite.example to change it")
    bad_spec = work / "bad.yaml"
    bad_spec.write_text(spec.read_text().replace("{nodes: 2", "{partition: long, nodes: 2"))
    refused = run_cli("submit", str(bad_spec), env=env, cwd=work)
    assert refused.returncode == 2 and "the site fixes resources.partition" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (work / "runs").exists(), "a refused submission left files behind"

    # The job still runs, with the module loaded and the variable set on the compute nodes.
    done = run_cli("submit", str(spec), "--wait", "--json", env=env, cwd=work, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads(done.stdout)
    assert payload["state"] == "COMPLETED" and payload["results"]["world_size"] == 2
    log = (work / "runs" / "sitejob" / f"slurm-{payload['job_id']}.out").read_text()
    assert "site check: module=loaded marker=from-site-template" in log


def test_profile_modules_and_mca_reach_every_rank(local_cluster, tmp_path, monkeypatch):
    """A site profile's module_init, module_paths and modules are loaded, and its mpi.mca
    settings are in force, in every rank on every node (what a rank sees, not the script)."""
    cluster, env = local_cluster
    modulefiles = tmp_path / "modulefiles"
    modulefiles.mkdir()
    (modulefiles / "site-tools").write_text("#%Module1.0\nsetenv HPCSUITE_SITE_MODULE loaded\n")
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        "name: modsite\nmodule_init: source /usr/share/modules/init/bash\n"
        f"module_paths: [{modulefiles}]\nmodules: [site-tools]\n"
        "mpi: {mca: {pml: ob1, btl: '^openib', btl_tcp_if_include: lo}}\n")
    (tmp_path / "envdump.py").write_text(
        "import json, os, horovod.torch as hvd\n"
        "from hpcsuite import api\n"
        "hvd.init()\n"
        "run = api.Run(hvd)\n"
        "keys = ('HPCSUITE_SITE_MODULE', 'OMPI_MCA_btl_tcp_if_include', 'OMPI_MCA_pml', 'SLURMD_NODENAME')\n"
        "(run.run_dir / f'env-{hvd.rank()}.json').write_text(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "run.finish()\n")
    (tmp_path / "job.yaml").write_text(
        "name: modjob\nresources: {nodes: 2, time: '00:05:00'}\ntrain: {script: envdump.py}\n")
    env = dict(env, HPCSUITE_PROFILE=str(profile))
    # Issue 51, point 5: lint --slurm and doctor's compute probe try the profile's module lines
    # as the jobs run them: a misspelt module, or Lmod's init on this Environment Modules site,
    # is found before any job dies of it.
    assert run_cli("lint", "job.yaml", "--slurm", env=env, cwd=tmp_path).returncode == 0
    for wrong, said in [("modules: [site-tools]", "modules: site-tool: the module system here "
                                                  "does not find it"),
                        ("source /usr/share/modules/init/bash",
                         "module_init: 'source /usr/share/lmod/lmod/init/bash' fails here")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(profile.read_text().replace(wrong, {
            "modules: [site-tools]": "modules: [site-tool]"}.get(wrong, "source /usr/share/lmod/lmod/init/bash")))
        lint = run_cli("lint", "job.yaml", "--slurm", env=dict(env, HPCSUITE_PROFILE=str(bad)),
                       cwd=tmp_path)
        assert lint.returncode == 2 and said in lint.stderr, lint.stderr
    import dataclasses
    import sys

    from hpcsuite.site import doctor
    from hpcsuite.submit.site_profile import SiteProfile

    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    good = SiteProfile(module_init="source /usr/share/modules/init/bash",
                       module_paths=[str(modulefiles)], modules=["site-tools"])
    assert doctor.check_compute(sys.executable, None, 180, profile=good).status != doctor.FAIL
    misspelt = dataclasses.replace(good, modules=["site-tool"])
    check = doctor.check_compute(sys.executable, None, 180, profile=misspelt)
    assert check.status == doctor.FAIL and check.detail.startswith(
        "the jobs' prologue from the site profile failed on a compute node"), check
    assert "site-tool" in check.detail, check
    done = run_cli("submit", "job.yaml", "--wait", "--json", env=env, cwd=tmp_path, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / json.loads(done.stdout)["run_dir"]
    seen = [json.loads((run_dir / f"env-{r}.json").read_text()) for r in (0, 1)]
    assert {s["SLURMD_NODENAME"] for s in seen} == {"node1", "node2"}
    for s in seen:
        assert s["HPCSUITE_SITE_MODULE"] == "loaded", s
        assert s["OMPI_MCA_btl_tcp_if_include"] == "lo" and s["OMPI_MCA_pml"] == "ob1", s
