"""hpcsuite-build-horovod and doctor's horovod-mpi check, the parts that need no build: what an
MPI says it is, the judge of Horovod's libmpi beside the launcher on PATH, the cache key, and
one line with exit 2 for each bad input. The build itself: tests/test_e2e_install.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsuite.site import build_horovod, horovod_mpi

# What each MPI prints: `mpirun --version` / `mpiexec --version`, and MPI_Get_library_version.
OUTPUTS = {
    "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/":
        ("openmpi", "4.1.4"),
    "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/":
        ("openmpi", "5.0.11"),
    "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022":
        ("openmpi", "4.1.4"),
    "HYDRA build details:\n    Version:                                 4.0.2\n"
    "    Release Date:                            Fri May 27 10:18:56 CDT 2022": ("mpich", "4.0.2"),
    "MPICH Version:      5.0.2\nMPICH Release date: Tue Sep  2 2026\nMPICH ABI:          17:0:5":
        ("mpich", "5.0.2"),
    "Intel(R) MPI Library for Linux* OS, Version 2021.19 Build 20260315 (id: 1a2b3c)":
        ("intelmpi", "2021.19"),
    "Intel(R) MPI Library 2021.19 for Linux* OS\n": ("intelmpi", "2021.19"),
}


@pytest.mark.parametrize("text, expected", OUTPUTS.items())
def test_an_mpi_says_which_it_is(text, expected):
    assert horovod_mpi.mpi_identity(text) == expected


def test_an_unknown_launcher_is_none():
    assert horovod_mpi.mpi_identity("srun: unrecognized option '--version'") is None


LINK = {"libs": ["torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"],
        "libmpi": {"libmpi.so.40": "/opt/ompi5/lib/libmpi.so.40"},
        "library_version": "Open MPI v5.0.11, package: Open MPI, ident: 5.0.11",
        "library_path": "/opt/ompi5/lib/libmpi.so.40.40.11"}
LAUNCHER = {"launcher": "mpirun", "path": "/opt/ompi5/bin/mpirun", "family": "openmpi",
            "version": "5.0.11"}


def test_horovod_linking_the_mpi_on_path_passes():
    status, detail, hint = horovod_mpi.judge(LINK, LAUNCHER)
    assert status == "pass" and hint == ""
    assert detail == ("Horovod links openmpi 5.0.11 (/opt/ompi5/lib/libmpi.so.40.40.11); "
                      "mpirun on PATH is openmpi 5.0.11 (/opt/ompi5/bin/mpirun)")


@pytest.mark.parametrize("link, launcher, said", [
    (LINK, {**LAUNCHER, "version": "4.1.4", "path": "/usr/bin/mpirun"},
     "Horovod links openmpi 5.0.11 (/opt/ompi5/lib/libmpi.so.40.40.11), but mpirun on PATH is "
     "openmpi 4.1.4 (/usr/bin/mpirun)"),
    (LINK, {"launcher": "mpiexec", "path": "/opt/mpich/bin/mpiexec", "family": "mpich",
            "version": "5.0.2"}, "but mpiexec on PATH is mpich 5.0.2"),
    ({**LINK, "libmpi": {"libmpi.so.40": "not"}}, LAUNCHER,
     "Horovod needs libmpi.so.40, which is not found under this environment"),
    ({**LINK, "libs": []}, LAUNCHER, "built without MPI"),
    ({"error": "no horovod in this Python"}, LAUNCHER, "no horovod in this Python"),
    (LINK, {"error": "no mpirun or mpiexec on PATH"}, "no mpirun or mpiexec on PATH"),
])
def test_horovod_and_the_launcher_disagreeing_fails_naming_both(link, launcher, said):
    status, detail, hint = horovod_mpi.judge(link, launcher)
    assert status == "fail" and said in detail and hint


def test_the_link_probe_reads_this_venvs_horovod():
    """This venv's Horovod (setup.sh's, against Debian's Open MPI) links the mpirun on PATH."""
    status, detail, _ = horovod_mpi.check(sys.executable, dict(os.environ))
    assert status == "pass", detail
    assert "Horovod links openmpi" in detail and "mpirun on PATH is openmpi" in detail


def test_the_cache_key_names_frameworks_python_and_the_mpis_home(tmp_path):
    mpi = {"family": "openmpi", "version": "5.0.11", "path": str(tmp_path / "a" / "bin" / "mpirun")}
    key = build_horovod.build_key({"torch": "2.13.0", "tf": None}, mpi)
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert key.startswith(f"horovod-0.28.1_torch-2.13.0_tf-none_{py}_openmpi-5.0.11-")
    other = build_horovod.build_key({"torch": "2.13.0", "tf": None},
                                    {**mpi, "path": str(tmp_path / "b" / "bin" / "mpirun")})
    assert other != key                       # the same version elsewhere is another build
    assert build_horovod.build_key({"torch": "2.13.0", "tf": None}, mpi, "cuda-13.0_nccl-2.28.3_cc-90") \
        == key + "_gpu-nccl_cuda-13.0_nccl-2.28.3_cc-90"


def entry(args, env, python=sys.executable):
    return subprocess.run([python, "-m", "hpcsuite.site.build_horovod", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_no_mpi_on_path_is_one_line_and_exit_2(tmp_path):
    done = entry([], {"PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "hpcsuite-build-horovod: error: no mpirun or mpiexec on PATH: module load the MPI the "
        "jobs will use first"]


def test_a_missing_sdist_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, HPCSUITE_CACHE=str(tmp_path / "cache"))
    done = entry(["--sdist", str(tmp_path / "nope.tar.gz"), "--rebuild"], env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"hpcsuite-build-horovod: error: --sdist {tmp_path / 'nope.tar.gz'}: no such file"]


def test_a_gpu_build_without_cuda_is_one_line_and_exit_2(tmp_path):
    """No CUDA toolkit or no NCCL here (whichever is missing first): the GPU part of the key
    cannot be made, and that is said before anything is downloaded or built."""
    env = dict(os.environ, HPCSUITE_CACHE=str(tmp_path), HOROVOD_GPU_OPERATIONS="NCCL",
               PATH=os.environ["PATH"].replace("/usr/local/cuda/bin", ""), CUDA_HOME="",
               HOROVOD_CUDA_HOME="")
    done = entry([], env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "hpcsuite-build-horovod: error: HOROVOD_GPU_OPERATIONS=NCCL: no "), lines
    assert "no CUDA toolkit: no nvcc in HOROVOD_CUDA_HOME" in lines[0] or \
        "no NCCL: looked for nccl.h in /usr/include" in lines[0], lines
    assert not list(tmp_path.iterdir())


def test_a_venv_without_a_framework_is_told_so(tmp_path):
    import venv

    venv.create(tmp_path / "v", system_site_packages=False)
    # hpcsuite importable, torch and TensorFlow not: this checkout on the path of a bare venv
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = entry([], env, python=str(tmp_path / "v" / "bin" / "python"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith("has neither torch nor TensorFlow: install one first "
                                        "(docs/admin/install.md)")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_cached_and_installed_build_only_checks(tmp_path):
    """This venv's Horovod under the key it would have: nothing is built or installed."""
    env = dict(os.environ, HPCSUITE_CACHE=str(tmp_path))
    frameworks = {k: build_horovod.installed(n) for k, n in build_horovod.FRAMEWORKS.items()}
    key = build_horovod.build_key(frameworks, horovod_mpi.launcher_identity(env))
    stamp = Path(sys.prefix) / build_horovod.STAMP
    assert not stamp.exists()
    stamp.write_text(key + "\n")
    try:
        done = entry([], env)
    finally:
        stamp.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr
    assert f"is installed for this key ({key})" in done.stderr
    assert "ready: Horovod links openmpi" in done.stderr
    assert not (tmp_path / "wheels").exists()
