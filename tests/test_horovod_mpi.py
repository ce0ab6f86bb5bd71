"""The rank's check that its Horovod links the MPI the site profile names (runtime/frameworks/horovod_mpi.py):
the parsing and the verdicts; the end-to-end refusal is in tests/test_e2e_mpis.py."""

import json
import os
import subprocess
import sys

import pytest

from hpcsuite import mpis
from hpcsuite.errors import UserError
from hpcsuite.runtime.frameworks import horovod_mpi
MAPS = """\
7f00a000-7f00b000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libopen-pal.so.40.30.2
7f00c000-7f00d000 r-xp 00000000 08:01 124 /work/main/.venv-mpich/lib/libmpi.so.12
7f00e000-7f00f000 r-xp 00000000 08:01 125 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4
7f010000-7f011000 rw-p 00000000 00:00 0
7f012000-7f013000 r-xp 00000000 08:01 126 /opt/libmpi_cxx.so.40
"""

VERSIONS = {
    "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4": "openmpi",
    "Open MPI v5.0.11, package: Open MPI runner@host Distribution, ident: 5.0.11": "openmpi5",
    "MPICH Version:      5.0.2": "mpich",
    "Intel(R) MPI Library 2021.19 for Linux* OS": "intelmpi",
}


def test_the_first_libmpi_mapped_is_the_one_horovod_loaded():
    assert horovod_mpi.loaded_libmpi(MAPS) == "/work/main/.venv-mpich/lib/libmpi.so.12"
    assert horovod_mpi.loaded_libmpi("7f0-7f1 r-xp 0 08:01 1 /opt/libmpi_cxx.so.40\n") is None
    assert horovod_mpi.loaded_libmpi("") is None


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_each_library_fits_its_own_flavour_only(version):
    for flavour in mpis.FLAVOURS:
        why = horovod_mpi.mismatch(flavour, version)
        assert (why is None) == (VERSIONS[version] == flavour), (flavour, version, why)


def test_the_profile_flavour_comes_from_the_run_directory(tmp_path):
    assert horovod_mpi.profile_flavour(str(tmp_path)) is None          # no profile.json
    assert horovod_mpi.profile_flavour(None) is None
    (tmp_path / "profile.json").write_text("{not json")
    assert horovod_mpi.profile_flavour(str(tmp_path)) is None
    (tmp_path / "profile.json").write_text(json.dumps({"mpi": {"flavour": "mpich"}}))
    assert horovod_mpi.profile_flavour(str(tmp_path)) == "mpich"


def _system_libmpi():
    path = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
    if os.path.exists(path):
        return path
    pytest.skip("Debian's Open MPI (libopenmpi3) is not installed")


def test_a_real_library_answers_its_version_before_mpi_init():
    version = horovod_mpi.library_version(_system_libmpi())
    assert version.startswith("Open MPI v4."), version
    assert horovod_mpi.library_version("/nonexistent/libmpi.so.40") is None


def test_a_rank_whose_mpi_is_not_the_profiles_stops_with_one_line(tmp_path):
    """In a child process that has loaded Debian's Open MPI 4.1 (as .venv's Horovod does)."""
    lib = _system_libmpi()
    code = (f"import ctypes, sys; ctypes.CDLL({lib!r}); from hpcsuite.runtime.frameworks import horovod_mpi;"
            "horovod_mpi.check(sys.argv[1], '/venv/site-packages/horovod/torch/__init__.py')")
    for flavour, expect in (("openmpi", 0), ("mpich", 1), ("openmpi5", 1)):
        (tmp_path / "profile.json").write_text(json.dumps({"mpi": {"flavour": flavour}}))
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                              text=True)
        assert proc.returncode == expect, proc.stderr
        if expect:
            last = proc.stderr.strip().splitlines()[-1]
            assert last.startswith("hpcsuite.errors.UserError: mpi.flavour: " + flavour), last
            assert f"scripts/setup.sh --mpi {flavour}" in last and "Open MPI v4.1" in last
            assert "(/venv/site-packages/horovod/torch)" in last


def test_nothing_is_said_when_the_flavour_or_library_is_unknown(tmp_path, monkeypatch):
    from hpcsuite import mpis

    monkeypatch.setattr(mpis, "BUILD_RECORDS", ())    # not this venv's own build record
    monkeypatch.setattr(horovod_mpi, "loaded_libmpi", lambda: None)
    (tmp_path / "profile.json").write_text(json.dumps({"mpi": {"flavour": "mpich"}}))
    horovod_mpi.check(str(tmp_path))                 # no libmpi loaded: nothing to compare
    monkeypatch.setattr(horovod_mpi, "loaded_libmpi", lambda: "/x/libmpi.so.12")
    monkeypatch.setattr(horovod_mpi, "library_version", lambda path: "MPICH Version: 4.0.2")
    horovod_mpi.check(str(tmp_path))
    horovod_mpi.check(None)
    monkeypatch.setattr(horovod_mpi, "library_version", lambda path: "Open MPI v5.0.11")
    with pytest.raises(UserError, match=r"^mpi\.flavour: mpich .* links Open MPI v5\.0\.11 at "
                                        r"/x/libmpi\.so\.12, not MPICH: "):
        horovod_mpi.check(str(tmp_path))


def test_a_module_that_makes_the_soname_resolve_to_another_mpi_is_named():
    """Issue 51, point 5b: Horovod built against Debian's Open MPI 4.1, the jobs' Open MPI 5
    module's LD_LIBRARY_PATH makes libmpi.so.40 resolve to 5.0.11, and mpirun is 5.0.11 too:
    doctor said ok, the job failed at once."""
    from hpcsuite.mpis import built_against
    from hpcsuite.site.horovod_mpi import judge

    link = {"libs": ["torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"],
            "libmpi": {"libmpi.so.40": "/opt/openmpi-5.0.11/lib/libmpi.so.40"},
            "library_version": "Open MPI v5.0.11, package: Open MPI builder Distribution, "
                               "ident: 5.0.11, repo rev: v5.0.11, Jun 25, 2025",
            "library_path": "/opt/openmpi-5.0.11/lib/libmpi.so.40.40.11",
            "built_for": "horovod-0.28.1_torch-2.13.0_tf-2.21.0_cp311_openmpi-4.1.4",
            "built_record": "/opt/venv/.horovod-key"}
    launcher = {"launcher": "mpirun", "path": "/opt/openmpi-5.0.11/bin/mpirun",
                "family": "openmpi", "version": "5.0.11"}
    status, detail, hint = judge(link, launcher)
    assert status == "fail", detail
    assert detail.startswith("Horovod was built against openmpi 4.1.4 (its build record "
                             "/opt/venv/.horovod-key), but under this environment libmpi.so.40 "
                             "resolves to openmpi 5.0.11"), detail
    assert "hpcsuite-build-horovod" in hint
    assert judge({**link, "built_for": "horovod-0.28.1_torch-2.13.0_cp311_openmpi-5.0.11-ab12cd34"},
                 launcher)[0] == "pass"
    assert built_against("horovod-0.28.1_torch-2.13.0_cp311_mpich-4.3.0-1a2b3c4d") == ("mpich", "4.3.0")
    assert built_against(None) is None


def test_the_rank_names_a_libmpi_of_another_release_than_its_build(tmp_path, monkeypatch):
    """Issue 51, point 5b, in the rank: the same soname resolved to Open MPI 5 under a build
    for 4.1 is named with its fix, not left to fail in MPI_Init."""
    import sys

    from hpcsuite.errors import UserError

    (tmp_path / ".horovod-key").write_text("horovod-0.28.1_torch-2.13.0_cp311_openmpi-4.1.4\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    open5 = "Open MPI v5.0.11, package: Open MPI builder Distribution, ident: 5.0.11"
    with pytest.raises(UserError, match=r"built against openmpi 4.1.4 \(its build record "
                                        r".*\.horovod-key\), but it loaded Open MPI 5.0.11 from "
                                        r"/opt/ompi5/lib/libmpi.so.40 .*hpcsuite-build-horovod"):
        horovod_mpi.built_mismatch("/opt/ompi5/lib/libmpi.so.40", open5)
    horovod_mpi.built_mismatch("/usr/lib/libmpi.so.40", "Open MPI v4.1.4, package: Debian")
