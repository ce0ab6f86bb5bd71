"""doctor's parsers and the checks that read only files (the rest run in test_e2e_doctor)."""

from hpcsuite.site import doctor
from hpcsuite.submit.site_profile import Mpi, Partition, SiteProfile

CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""


def test_parse_check_build():
    b = doctor.parse_check_build(CHECK_BUILD)
    assert b == {"frameworks": {"TensorFlow", "PyTorch"}, "controllers": {"MPI", "Gloo"},
                 "operations": {"MPI", "Gloo"}}


def test_parse_mpi_list_includes_pmix_versions():
    text = ("MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
            "specific pmix plugin versions available: pmix_v4,pmix_v5\n")
    assert doctor.parse_mpi_list(text) == {"pmix", "none", "cray_shasta", "pmi2", "pmix_v4", "pmix_v5"}


CPU_GPU = {"mpi": 1, "gloo": 1, "nccl": 0, "ddl": 0, "ccl": 0, "cuda": 0, "rocm": 0}


def build(**kw):
    """horovod_build's answer for this machine's build (CHECK_BUILD's marks), changed by kw."""
    return {"frameworks": {"TensorFlow", "PyTorch"}, "controllers": {"MPI", "Gloo"},
            "operations": {"MPI", "Gloo"}, "missing": {}, "gpu": CPU_GPU, **kw}


def test_gpu_partitions_need_a_horovod_built_with_nccl():
    gpu = SiteProfile(partitions={"gpu": Partition(gpus_per_node=4)})
    check = doctor.check_horovod(build(), gpu)
    assert check.status == doctor.FAIL and "no NCCL" in check.detail and "NCCL" in check.hint
    assert doctor.check_horovod(build(operations={"MPI", "Gloo", "NCCL"}), gpu).status == doctor.PASS
    assert doctor.check_horovod(build(), SiteProfile()).status == doctor.PASS
    assert doctor.check_horovod(build(controllers={"Gloo"}), SiteProfile()).status == doctor.FAIL
    missing = doctor.check_horovod({"error": "horovod.torch: ModuleNotFoundError: No module "
                                    "named 'horovod'"}, SiteProfile())
    assert missing.status == doctor.FAIL and "install Horovod" in missing.hint
    no_tf = doctor.check_horovod(build(frameworks={"PyTorch"}, missing={
        "TensorFlow": "ModuleNotFoundError: No module named 'tensorflow'"}), SiteProfile())
    # a torch-only venv (issue 51, point 5d): nothing is broken, nothing to warn of
    assert no_tf.status == doctor.PASS and no_tf.detail.endswith("; TensorFlow not installed")
    assert "hpcsuite-build-horovod" in missing.hint and "setup.sh" not in missing.hint
    broken = doctor.check_horovod(build(frameworks={"PyTorch"}, missing={
        "TensorFlow": "ImportError: Extension horovod.tensorflow has not been built"}), SiteProfile())
    assert broken.status == doctor.WARN and broken.detail.endswith(
        "; no TensorFlow support (ImportError: Extension horovod.tensorflow has not been built)")


def test_doctor_says_whether_horovod_has_nccl_and_cuda():
    """From horovod.torch's nccl_built() (NCCL_VERSION_CODE: 22803 is 2.28.3, 2804 is 2.8.4
    before NCCL 2.9) and cuda_built(), asked in a subprocess on the real machine."""
    check = doctor.check_horovod(build(operations={"MPI", "Gloo", "NCCL"},
                                       gpu={**CPU_GPU, "nccl": 22803, "cuda": 1}), SiteProfile())
    assert check.status == doctor.PASS and check.detail.endswith("; GPU build: CUDA, NCCL 2.28.3")
    assert doctor.check_horovod(build(), SiteProfile()).detail.endswith(
        "; GPU build: no CUDA, no NCCL")
    assert doctor.describe_gpu_build({"nccl": 2804, "cuda": True}) == "GPU build: CUDA, NCCL 2.8.4"
    assert doctor.describe_gpu_build({"error": "ModuleNotFoundError: No module named 'torch'"}) \
        == "GPU build not known (horovod.torch: ModuleNotFoundError: No module named 'torch')"


def test_horovods_build_from_a_python_without_horovod(tmp_path):
    """The probe runs the site's python: one that cannot import Horovod is one error naming
    each framework module (the real build is asked in test_e2e_doctor)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'horovod'\" >&2\nexit 1\n")
    python.chmod(0o755)
    assert doctor.horovod_build(str(python)) == {
        "error": "horovod.torch: ModuleNotFoundError: No module named 'horovod'; "
                 "horovod.tensorflow: ModuleNotFoundError: No module named 'horovod'"}


def test_network_names_must_exist(tmp_path):
    net = tmp_path / "net"
    for name in ("lo", "eth0", "ib0"):
        (net / name).mkdir(parents=True)
    ok = doctor.check_network({"NCCL_SOCKET_IFNAME": "eth"}, SiteProfile(), net)
    assert ok.status == doctor.PASS and "NCCL_SOCKET_IFNAME=eth" in ok.detail
    bad = doctor.check_network({"NCCL_SOCKET_IFNAME": "=eno1"}, SiteProfile(), net)
    assert bad.status == doctor.FAIL and "names eno1" in bad.detail
    mca = SiteProfile(mpi=Mpi(mca={"btl_tcp_if_include": "ens5,10.0.0.0/8"}))
    assert doctor.check_network({}, mca, net).status == doctor.FAIL
    assert doctor.check_network({"NCCL_SOCKET_IFNAME": "^docker"}, SiteProfile(), net).status == doctor.PASS


def test_ucx_without_infiniband_warns(tmp_path):
    ucx = SiteProfile(mpi=Mpi(mca={"pml": "ucx"}))
    assert doctor.check_infiniband(ucx, tmp_path / "none").status == doctor.WARN
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    assert doctor.check_infiniband(ucx, tmp_path / "ib").status == doctor.PASS


def test_report_marks_each_check():
    text = doctor.report([doctor.Check("slurm", doctor.PASS, "partitions debug (up)"),
                          doctor.Check("pmi", doctor.FAIL, "srun --mpi=pmix_v9 missing", "set it")])
    assert "ok   slurm" in text and "FAIL pmi" in text and "-> set it" in text
    assert text.endswith("2 checks: 1 failed, 0 warnings")


def test_the_slow_checks_run_side_by_side_and_doctor_says_what_it_waits_for(monkeypatch):
    """Horovod's build and the compute node's srun each take seconds (they import
    frameworks): they overlap, and progress names them as they start and end. The subprocesses are replaced by sleeps here; test_e2e_doctor runs the real ones."""
    import time

    quick = doctor.Check("x", doctor.PASS, "ok")
    for name in ("check_slurm", "check_accounting", "check_mpi", "check_infiniband", "check_gpus",
                 "check_slurm_rules"):
        monkeypatch.setattr(doctor, name, lambda *a, **k: quick)
    monkeypatch.setattr(doctor, "check_pmi", lambda *a, **k: quick)
    monkeypatch.setattr(doctor, "check_network", lambda *a, **k: quick)

    def slow(answer):
        def run(*a, **k):
            time.sleep(0.6)
            return answer
        return run

    monkeypatch.setattr(doctor, "horovod_build", slow(build()))
    monkeypatch.setattr(doctor, "check_compute", slow(doctor.Check("compute", doctor.PASS, "probe")))
    monkeypatch.setattr(doctor.horovod_mpi, "check", slow(("pass", "links the MPI on PATH", "")))
    said = []
    started = time.monotonic()
    checks = doctor.run_checks(SiteProfile(), progress=said.append)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, elapsed                     # three 0.6 s waits at once, not 1.8 s
    assert [c.name for c in checks][-2:] == ["fabric", "compute"], [c.name for c in checks]
    horovod = next(c for c in checks if c.name == "horovod")
    assert "GPU build: no CUDA, no NCCL" in horovod.detail
    assert said[0].startswith("waiting for Horovod's build") and "srun" in said[0]
    assert [s.split(":")[0] for s in said[1:]] == ["horovod", "horovod-mpi", "compute"], said
    assert next(c for c in checks if c.name == "horovod-mpi").detail == "links the MPI on PATH"
    without = doctor.run_checks(SiteProfile(), compute=False, progress=said.append)
    assert "compute" not in [c.name for c in without]


def test_the_compute_probe_runs_the_jobs_prologue_with_the_partitions_account(monkeypatch):
    """Issue 51, point 5a: a profile whose modules break every job failed nothing in doctor,
    whose probe was a bare `srun python`."""
    from hpcsuite.submit.site_profile import Partition

    profile = SiteProfile(module_init="source /usr/share/lmod/lmod/init/bash",
                          modules=["openmpi/5.0", "nosuch/1.0"], module_paths=["/apps/mods"],
                          setup=["export SCRATCH=/tmp"],
                          partitions={"gpu": Partition(account="ml")})
    asked = []

    def run(argv, timeout=0):
        asked.append(argv)
        return 1, "ERROR: Unable to locate a modulefile for 'nosuch/1.0'\nsrun: error: exit 1"

    monkeypatch.setattr(doctor, "_run", run)
    check = doctor.check_compute("/opt/venv/bin/python", "gpu", profile=profile)
    argv = asked[0]
    assert "--partition=gpu" in argv and "--account=ml" in argv
    script = argv[argv.index("-c") + 1]
    assert script.splitlines()[:6] == ["set -eo pipefail", "source /usr/share/lmod/lmod/init/bash",
                                      "module use /apps/mods", "module load openmpi/5.0",
                                      "module load nosuch/1.0", "export SCRATCH=/tmp"]
    assert argv[-2] == "/opt/venv/bin/python"
    assert check.status == doctor.FAIL and check.detail.startswith(
        "the jobs' prologue from the site profile failed on a compute node: ERROR: Unable to "
        "locate a modulefile for 'nosuch/1.0'")
    assert "module_init" in check.hint
    # no prologue: the bare probe, as before
    assert doctor.compute_argv("python3", None, SiteProfile())[-3:] == ["python3", "-c", doctor.PROBE]
