"""Rendering is strict and shell-safe."""

import dataclasses
import json
import subprocess

import pytest

from hpcsuite.errors import UserError
from hpcsuite.submit.plan import plan
from hpcsuite.submit.site_profile import Mpi, SiteProfile
from hpcsuite.submit.spec import spec_from_dict
from hpcsuite.submit.templating import SearchPath, render

EVIL = "$(touch {canary}); `touch {canary}`; ' \" && touch {canary} | x > {canary}"


def test_values_with_shell_metacharacters_stay_inert(tmp_path):
    """Run the rendered script's value lines in bash: the canary must never appear."""
    canary = tmp_path / "CANARY"
    evil = EVIL.format(canary=canary)
    job = spec_from_dict({"name": "evil", "env": {"EVIL": evil},
                          "train": {"checkpoint": {"dir": f"c {evil}"}}}, "test")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    # Execute everything up to the launch line with the launcher replaced by a harmless echo.
    head = script.split("\nHPCSUITE_PY=")[0]
    probe = head + '\nprintf "%s" "$EVIL" > "$RUN_DIR/evil.txt"\n'
    (tmp_path / "job.sh").write_text(probe)
    subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, check=True,
                   env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"})
    assert not canary.exists()
    run_dir = tmp_path / "runs" / "evil" / "7"
    assert (run_dir / "evil.txt").read_text() == evil
    written = json.loads((run_dir / "job.json").read_text())
    assert written["env"]["EVIL"] == evil and written["train"]["checkpoint"]["dir"] == f"c {evil}"


@pytest.mark.parametrize("field", ["env", "setup"])
def test_newline_that_skipped_validation_is_still_refused(field):
    """Values built in code bypass the YAML checks; rendering refuses them anyway."""
    job = spec_from_dict({"name": "x"}, "test")
    profile = SiteProfile(python="python3")
    if field == "env":
        job = dataclasses.replace(job, env={"A": "a\nb"})
    else:
        profile = dataclasses.replace(profile, setup=["echo ok\nrm -rf /"])
    with pytest.raises(UserError, match="newline or NUL"):
        plan(job, profile, SearchPath.builtin_only())


def test_undefined_variable_names_template_file_and_line(tmp_path):
    (tmp_path / "broken.sbatch.j2").write_text("#!/bin/bash\n\necho {{ nope }}\n")
    path = SearchPath((("cli", tmp_path),))
    with pytest.raises(UserError) as exc:
        render(path, "broken", {})
    assert f"{tmp_path / 'broken.sbatch.j2'}:3: undefined variable" in str(exc.value)


def test_syntax_error_names_file_and_line(tmp_path):
    (tmp_path / "bad.sbatch.j2").write_text("#!/bin/bash\n{% if %}\n")
    with pytest.raises(UserError, match=r"bad.sbatch.j2:2: template syntax error"):
        render(SearchPath((("cli", tmp_path),)), "bad", {})


def test_unknown_template_lists_available():
    with pytest.raises(UserError, match=r"template 'horovd' not found \(did you mean \"horovod\"\?\)"):
        SearchPath.builtin_only().which("horovd")


def test_search_path_order_cli_wins(tmp_path):
    (tmp_path / "horovod.sbatch.j2").write_text("#!/bin/bash\n# mine\n")
    path = SearchPath.default(template_dir=str(tmp_path), cwd=tmp_path)
    assert path.which("horovod") == tmp_path / "horovod.sbatch.j2"
    assert [layer for layer, _ in path.dirs] == ["cli", "project", "user", "site", "builtin"]


def test_mpirun_launch_line():
    job = spec_from_dict({"name": "x", "resources": {"nodes": 2, "tasks_per_node": 3}}, "t")
    script = plan(job, SiteProfile(python="/opt/py env/python"), SearchPath.builtin_only()).script
    launch = [l for l in script.splitlines() if l.startswith("mpirun ")][0]
    assert "-np 6 -npernode 3 --map-by slot --bind-to none" in launch
    assert "'/opt/py env/python' -m hpcsuite train --job \"$RUN_DIR/job.json\"" in launch
    assert "-x HOROVOD_FUSION_THRESHOLD" in launch


def test_srun_launch_line():
    job = spec_from_dict({"name": "x", "launcher": "srun"}, "t")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert "srun --mpi=pmix --kill-on-bad-exit=1 --ntasks=1" in script


def test_horovod_knobs_become_environment_for_every_rank():
    job = spec_from_dict({"name": "x", "train": {"horovod": {
        "fusion_threshold_mb": 32, "cycle_time_ms": 2.5, "stall_check_seconds": 30,
        "stall_shutdown_seconds": 90, "timeline": True, "autotune": True}}}, "t")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    for line in ("export HOROVOD_FUSION_THRESHOLD=33554432", "export HOROVOD_CYCLE_TIME=2.5",
                 "export HOROVOD_STALL_CHECK_TIME_SECONDS=30",
                 "export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=90",
                 'export HOROVOD_TIMELINE="$RUN_DIR/horovod-timeline.json"',
                 "export HOROVOD_AUTOTUNE=1"):
        assert line in script.splitlines()
    launch = [l for l in script.splitlines() if l.startswith("mpirun ")][0]
    assert "-x HOROVOD_TIMELINE" in launch and "-x HOROVOD_AUTOTUNE" in launch
    # Set for the ranks by the template, never from Python.
    assert script.index("export HOROVOD_TIMELINE") > script.index("RUN_DIR=")


def test_stall_check_zero_disables_it():
    job = spec_from_dict({"name": "x", "train": {"horovod": {"stall_check_seconds": 0}}}, "t")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert "export HOROVOD_STALL_CHECK_DISABLE=1" in script


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_ranks_with_one_core_yield_while_waiting_in_mpi(launcher):
    """One core per rank is shared with Horovod's background thread: MPI must not spin on it."""
    job = spec_from_dict({"name": "x", "launcher": launcher}, "t")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert "export OMPI_MCA_mpi_yield_when_idle=1" in script.splitlines()
    if launcher == "mpirun":
        assert "-x OMPI_MCA_mpi_yield_when_idle" in [l for l in script.splitlines()
                                                     if l.startswith("mpirun ")][0]


def test_ranks_with_cores_to_spare_and_site_choices_keep_mpi_defaults():
    two = spec_from_dict({"name": "x", "resources": {"cpus_per_task": 2}}, "t")
    assert "OMPI_MCA_mpi_yield_when_idle" not in plan(
        two, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    one = spec_from_dict({"name": "x"}, "t")
    site = SiteProfile(python="python3", mpi=Mpi(mca={"pml": "ob1", "mpi_yield_when_idle": "0"}))
    script = plan(one, site, SearchPath.builtin_only()).script
    assert "OMPI_MCA_mpi_yield_when_idle" not in script
    assert "--mca mpi_yield_when_idle 0" in script
    mine = spec_from_dict({"name": "x", "env": {"OMPI_MCA_mpi_yield_when_idle": "0"}}, "t")
    assert "export OMPI_MCA_mpi_yield_when_idle=0" in plan(
        mine, SiteProfile(python="python3"), SearchPath.builtin_only()).script.splitlines()


def test_mpiruns_ranks_get_time_to_save_after_slurms_own_sigterm():
    """Slurm's TERM reaches mpirun and the orteds; each orted then SIGKILLs its ranks after
    odls_base_sigkill_timeout (1 s by default), before a requeued job's ranks had saved. The
    script gives them longer; a site's own value wins."""
    job = spec_from_dict({"name": "x"}, "t")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert "export OMPI_MCA_odls_base_sigkill_timeout=10" in script.splitlines()
    site = SiteProfile(python="python3",
                       mpi=Mpi(mca={"pml": "ob1", "odls_base_sigkill_timeout": "40"}))
    script = plan(job, site, SearchPath.builtin_only()).script
    assert "OMPI_MCA_odls_base_sigkill_timeout" not in script
    assert "--mca odls_base_sigkill_timeout 40" in script


def test_an_sbatch_that_times_out_says_the_job_may_exist_and_keeps_nothing(tmp_path, monkeypatch):
    from hpcsuite import slurm
    from hpcsuite.errors import UserError
    from hpcsuite.runner.submit import SBATCH_TIMEOUT_S, sbatch

    def slow(argv, **kw):
        assert kw["timeout"] == SBATCH_TIMEOUT_S
        raise slurm.TimedOut(f"sbatch did not answer within {kw['timeout']}s: {' '.join(argv)}")

    monkeypatch.setattr(slurm, "call", slow)
    job = spec_from_dict({"name": "x"}, "t")
    request = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only())
    staged = tmp_path / ".submit-1.sbatch"
    with pytest.raises(UserError, match="may have been submitted all the same: check squeue"):
        sbatch(request, staged)
    assert not staged.exists()


@pytest.mark.parametrize("train", [
    {"preemption": {"signal": "USR1", "lead_seconds": 60}},                     # nothing to save
    {"script": "train.py", "preemption": {"signal": "USR2", "lead_seconds": 60}},
    {"checkpoint": {"every_steps": 10}},                                        # the default lead
])
def test_a_rendered_warning_signal_is_always_trapped(train):
    """Slurm's --signal=B:SIG kills an untrapped batch shell, and the job with it, unrecorded:
    whenever the header asks for one, the script traps it."""
    job = spec_from_dict({"name": "sig", "train": train}, "test")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    signal = job.train.preemption.signal
    assert f"#SBATCH --signal=B:{signal}@" in script
    assert f"trap 'stop_requested {signal}' {signal}" in script
    assert "trap 'stop_requested TERM' TERM" in script


def test_no_warning_signal_no_trap():
    job = spec_from_dict({"name": "plain"}, "test")
    script = plan(job, SiteProfile(python="python3"), SearchPath.builtin_only()).script
    assert "--signal" not in script and "trap " not in script
