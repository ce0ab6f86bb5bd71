"""Containers: the site's runtime and allow-list, the job's image and binds, and the launch
line each runtime renders (apptainer/singularity and pyxis are checked here and in the golden
scripts only; charliecloud also end to end in test_e2e_container.py)."""

import shlex

import pytest
from click.testing import CliRunner

from hpcsuite.cli import main
from hpcsuite.site import doctor
from hpcsuite.submit.config import resolve
from hpcsuite.submit.containers import image_allowed
from hpcsuite.submit.plan import plan
from hpcsuite.submit.templating import SearchPath


def site(work, runtime="apptainer", extra=""):
    path = work / "site.yaml"
    path.write_text(f"container:\n  runtime: {runtime}\n  allowed_images: [/img/, 'reg.io#ml/', "
                    f"'/shared/*.sif']\n  binds: [/scratch]\n{extra}")
    return path


def launch_words(work, spec_text, profile):
    spec = work / "job.yaml"
    spec.write_text(spec_text)
    r = resolve(str(spec), str(profile), ambient=False)
    script = plan(r.job, r.profile, SearchPath.builtin_only(), r.locks).script
    line = next(l for l in script.splitlines() if l.startswith(("mpirun ", "srun ")))
    return script, shlex.split(line.rstrip(" &"))


def refusal(work, spec_text, profile):
    spec = work / "job.yaml"
    spec.write_text(spec_text)
    result = CliRunner().invoke(main, ["render", str(spec), "--profile", str(profile)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("image, allowed", [
    ("/img/a.sif", True), ("/img/sub/a.sif", True), ("/imgs/a.sif", False),
    ("/shared/x.sif", True), ("/shared/x/y.sif", False), ("/shared/x.sqsh", False),
    ("reg.io#ml/torch:1", True), ("reg.io#mlx/torch:1", False), ("docker://reg.io/ml/x", False),
])
def test_allowed_images_prefixes_and_globs(image, allowed):
    assert image_allowed(image, ["/img/", "reg.io#ml/", "/shared/*.sif"]) is allowed


def test_any_image_when_the_site_lists_none():
    assert image_allowed("anything:1", [])


def test_apptainer_binds_the_job_paths_and_runs_the_image(work):
    script, words = launch_words(work, "name: j\ncontainer: {image: /img/t.sif, binds: [/data:/in]}\n"
                                 "train:\n  data: {kind: npy, path: /datasets/d}\n"
                                 "  checkpoint: {dir: ../ck, every_steps: 5}\n", site(work))
    i = words.index("apptainer")
    assert words[:2] == ["mpirun", "-np"] and words[i + 1] == "exec"
    assert words[words.index("--bind") + 1].split(",") == [
        "$SLURM_SUBMIT_DIR", "${RUN_DIR%/*}", "/datasets/d", "$SLURM_SUBMIT_DIR/../ck", "/scratch",
        "/data:/in"]
    assert words[words.index("--pwd") + 1] == "$SLURM_SUBMIT_DIR"
    assert words[words.index("/img/t.sif") + 1:][:4] == ["python3", "-m", "hpcsuite", "train"]
    assert 'case "$SLURM_SUBMIT_DIR" in *[,:]*)' in script


def test_singularity_is_the_same_model(work):
    _, words = launch_words(work, "name: j\ncontainer: {image: /img/t.sif}\n",
                            site(work, "singularity"))
    assert words[words.index("singularity") + 1] == "exec"


def test_pyxis_puts_the_image_on_srun(work):
    _, words = launch_words(work, "name: j\nlauncher: srun\ncontainer: {image: 'reg.io#ml/t:1'}\n",
                            site(work, "pyxis", "  options: [--container-remap-root]\n"))
    assert words[0] == "srun" and "--container-image=reg.io#ml/t:1" in words
    mounts = next(w for w in words if w.startswith("--container-mounts="))
    assert mounts.split("=", 1)[1].split(",") == [
        "$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR", "${RUN_DIR%/*}:${RUN_DIR%/*}", "/scratch:/scratch"]
    assert "--container-workdir=$SLURM_SUBMIT_DIR" in words and "--container-remap-root" in words
    assert words[words.index("--container-remap-root") + 1:][:4] == ["python3", "-m", "hpcsuite", "train"]


def test_charliecloud_binds_each_path_and_sets_user(work):
    script, words = launch_words(work, "name: j\ncontainer: {image: /img/dir}\n",
                                 site(work, "charliecloud", "  python: /opt/py/bin/python\n"))
    i = words.index("ch-run")
    assert words[i + 1:i + 7] == ["-b", "$SLURM_SUBMIT_DIR", "-b", "${RUN_DIR%/*}", "-b", "/scratch"]
    assert words[words.index("/img/dir") + 1:][:2] == ["--", "/opt/py/bin/python"]
    assert "-x" in words and words[words.index("USER") - 1] == "-x"
    assert 'export USER="${USER:-$(id -un)}"' in script


def test_a_job_without_an_image_runs_on_the_host(work):
    _, words = launch_words(work, "name: j\n", site(work, "charliecloud"))
    assert "ch-run" not in words and "python3" not in words   # the profile's interpreter


@pytest.mark.parametrize("spec, runtime, message", [
    ("container: {image: /home/me/x.sif}", "apptainer",
     "job.yaml: container.image: '/home/me/x.sif' is not an image this site allows"),
    ("container: {image: /img/../home/x.sif}", "apptainer", "container.image: '/img/../home/x.sif': '..'"),
    ("container: {image: '/img/a.sif --bind /:/h'}", "apptainer", "container.image: '/img/a.sif --bind"),
    ("container: {image: '/img/$(id).sif'}", "apptainer", "container.image: '/img/$(id).sif' is not valid"),
    ("container: {image: /img/a, binds: [data]}", "apptainer", "container.binds[0]: 'data' is not valid"),
    ("container: {image: /img/a, binds: ['/a,/b']}", "apptainer", "container.binds[0]: '/a,/b' is not valid"),
    ("container: {image: /img/a, binds: ['/a:/b:/c']}", "apptainer", "container.binds[0]: '/a:/b:/c'"),
    ("container: {image: /img/a, binds: [/a/../etc]}", "apptainer", "container.binds[0]: '/a/../etc': '..'"),
    ("container: {binds: [/a]}", "apptainer", "container.binds: binds without container.image"),
    ("container: {image: 'reg.io#ml/t:1'}", "pyxis",
     "job.yaml: launcher: the site's container runtime pyxis starts ranks through srun"),
    ("container: {image: /img/a}\ntrain: {data: {kind: npy, path: '/d:x'}}", "apptainer",
     "train.data.path: '/d:x' is bound into the container, and a bound path cannot hold ':'"),
])
def test_refused_in_one_line_naming_the_key(work, spec, runtime, message):
    assert message in refusal(work, f"name: j\n{spec}\n", site(work, runtime))


def test_no_runtime_no_image(work):
    profile = work / "plain.yaml"
    profile.write_text("name: plain\n")
    assert "job.yaml: container.image: this site names no container runtime" in refusal(
        work, "name: j\ncontainer: {image: /img/a}\n", profile)


def test_site_profile_refuses_unknown_runtimes_and_bad_lists(work):
    for extra, message in [("container: {runtime: docker}", "container.runtime"),
                           ("container: {runtime: apptainer, binds: [rel]}", "container.binds[0]"),
                           ("container: {runtime: apptainer, allowed_images: ['/a/../b/']}",
                            "container.allowed_images[0]")]:
        profile = work / "bad.yaml"
        profile.write_text(extra + "\n")
        line = refusal(work, "name: j\n", profile)
        assert line.startswith(f"error: {profile}: {message}"), line


def test_only_the_site_names_the_runtime(work):
    (work / ".hpcsuite").mkdir()
    (work / ".hpcsuite" / "profile.yaml").write_text("container: {runtime: charliecloud}\n")
    (work / "site").mkdir()
    (work / "site" / "profile.yaml").write_text("container: {runtime: apptainer}\n")
    (work / "job.yaml").write_text("name: j\n")
    result = CliRunner().invoke(main, ["render", "job.yaml"])
    assert result.exit_code == 2 and "container" in result.output and "site" in result.output


def test_the_site_can_lock_the_image(work):
    profile = site(work, extra="defaults: {container: {image: /img/blessed.sif}}\n"
                               "locked: [container.image]\n")
    line = refusal(work, "name: j\ncontainer: {image: /img/other.sif}\n", profile)
    assert "container.image: the site fixes container.image" in line
    _, words = launch_words(work, "name: j\n", profile)
    assert "/img/blessed.sif" in words


def test_doctor_charliecloud_runs_a_throwaway_image():
    import shutil

    from hpcsuite.submit.site_profile import ContainerSite, SiteProfile

    check = doctor.check_container(SiteProfile(container=ContainerSite(runtime="charliecloud")))
    if shutil.which("ch-run") is None:
        assert check.status == doctor.FAIL and "charliecloud-runtime" in check.hint
    else:
        assert check.status == doctor.PASS and "throwaway image" in check.detail, check


def test_doctor_names_a_missing_runtime_and_a_failed_smoke(monkeypatch):
    from hpcsuite.submit.site_profile import ContainerSite, SiteProfile

    assert doctor.check_container(SiteProfile()) is None
    monkeypatch.setattr(doctor, "_run", lambda argv, **kw: (127, "not found"))
    check = doctor.check_container(SiteProfile(container=ContainerSite(runtime="apptainer")))
    assert (check.status, check.detail) == (doctor.FAIL, "apptainer is not on PATH")
    answers = iter([(0, "0.31"), (1, "ch-run[1]: error: can't map UID")])
    monkeypatch.setattr(doctor, "_run", lambda argv, **kw: next(answers))
    check = doctor.check_container(SiteProfile(container=ContainerSite(runtime="charliecloud")))
    assert check.status == doctor.FAIL and "can't map UID" in check.detail
    monkeypatch.setattr(doctor, "_run", lambda argv, **kw: (0, "usage: srun [OPTIONS]"))
    check = doctor.check_container(SiteProfile(container=ContainerSite(runtime="pyxis")))
    assert check.status == doctor.FAIL and "plugstack.conf" in check.hint
