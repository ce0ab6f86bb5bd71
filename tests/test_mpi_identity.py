"""What an MPI is, from one table (hpcsuite/mpis.py), and its four readers agreeing on it: lint
and the launch lines (submit/mpi_flavours.py), doctor (site/slurm_versions.py,
site/horovod_mpi.py) and the rank's check before hvd.init() (runtime/frameworks/horovod_mpi.py).

The texts are what the real programs print: MPI_Get_library_version (Open MPI's ompi/mpi/c's
"Open MPI v%d.%d.%d, package: ..."; MPICH's src/mpi/init's "MPICH Version:      %s\\n" block;
Cray MPICH's "MPI VERSION    : CRAY MPICH version ..."; MVAPICH2's "MVAPICH2 Version      :\\t%s\\n"
block; Intel MPI's "Intel(R) MPI Library 2021.N for Linux* OS"), the launchers' --version,
ompi_info, mpichversion and MVAPICH2's mpiname."""

import dataclasses
import typing
from types import SimpleNamespace

import pytest

from hpcsuite import mpis
from hpcsuite.errors import UserError
from hpcsuite.runtime.frameworks import horovod_mpi as rank_check
from hpcsuite.site import doctor, horovod_mpi as site_mpi
from hpcsuite.site.slurm_versions import judge_mpi
from hpcsuite.submit import mpi_flavours, site_profile

OPEN_MPI_4 = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
OPEN_MPI_5 = "Open MPI v5.0.7, package: Debian OpenMPI, ident: 5.0.7, repo rev: v5.0.7, Feb 14, 2025"
OPEN_MPI_6 = ("Open MPI v6.0.0, package: Open MPI runner@host Distribution, ident: 6.0.0, "
              "repo rev: v6.0.0, Unreleased developer copy")
MPICH = ("MPICH Version:      4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022\n"
         "MPICH ABI:          14:2:2\nMPICH Device:       ch4:ofi\n"
         "MPICH configure:    --prefix=/usr --with-device=ch4:ofi\nMPICH CC:           gcc -O2\n")
INTEL_MPI = "Intel(R) MPI Library 2021.10 for Linux* OS\n\n"
CRAY_MPICH = ("MPI VERSION    : CRAY MPICH version 8.1.27.26 (ANL base 3.4a2)\n"
              "MPI BUILD INFO : Sun Jul 16 14:45 2023 (git hash 0d7a3bd)\n")
MVAPICH2 = ("MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022\n"
            "MVAPICH2 Device       :\tch3:mrail\nMVAPICH2 configure    :\t--prefix=/opt/mvapich2 "
            "--with-device=ch3:mrail --with-rdma=gen2\nMVAPICH2 CC           :\tgcc -DNDEBUG -O2\n")

# text -> (what messages call it, its family, its version, the flavour that takes it)
LIBRARY_VERSIONS = {
    OPEN_MPI_4: ("Open MPI", "openmpi", "4.1.4", "openmpi"),
    OPEN_MPI_5: ("Open MPI", "openmpi", "5.0.7", "openmpi5"),
    MPICH: ("MPICH", "mpich", "4.0.2", "mpich"),
    INTEL_MPI: ("Intel MPI", "intelmpi", "2021.10", "intelmpi"),
    CRAY_MPICH: ("Cray MPICH", "mpich", "8.1.27.26", "mpich"),
    MVAPICH2: ("MVAPICH2", "mpich", "2.3.7", "mpich"),
}
# what the launchers and the MPIs' own tools print
TOOL_OUTPUTS = {
    "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/":
        ("Open MPI", "openmpi", "4.1.4", "openmpi"),
    "mpirun (Open MPI) 5.0.7\n\nReport bugs to https://www.open-mpi.org/community/help/":
        ("Open MPI", "openmpi", "5.0.7", "openmpi5"),
    # ompi_info
    "                 Package: Debian OpenMPI\n                Open MPI: 4.1.4\n"
    "  Open MPI repo revision: v4.1.4\n   Open MPI release date: May 26, 2022\n":
        ("Open MPI", "openmpi", "4.1.4", "openmpi"),
    "HYDRA build details:\n    Version:                                 4.0.2\n"
    "    Release Date:                            Thu Apr  7 12:34:45 CDT 2022\n":
        ("MPICH", "mpich", "4.0.2", "mpich"),
    # mpichversion
    "MPICH Version:    \t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022\n":
        ("MPICH", "mpich", "4.0.2", "mpich"),
    "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
    "Copyright 2003-2023, Intel Corporation.": ("Intel MPI", "intelmpi", "2021.10", "intelmpi"),
    # MVAPICH2's mpichversion and mpiname -a
    "MVAPICH2 Version:     \t2.3.7\nMVAPICH2 Release date: \tWed March 02 22:00:00 EST 2022\n":
        ("MVAPICH2", "mpich", "2.3.7", "mpich"),
    "MVAPICH2 2.3.7 Wed March 02 22:00:00 EST 2022 ch3:mrail": ("MVAPICH2", "mpich", "2.3.7", "mpich"),
}
IDENTITIES = {**LIBRARY_VERSIONS, **TOOL_OUTPUTS}


def first_line(text):
    """What the rank's library_version hands its check: the first line only."""
    return text.strip().splitlines()[0].strip()


@pytest.mark.parametrize("text", IDENTITIES)
def test_each_real_version_text_names_its_mpi_family_version_and_flavour(text):
    name, family, version, flavour = IDENTITIES[text]
    found = mpis.identify(text)
    assert (found.library.name, found.library.family, found.version) == (name, family, version)
    assert str(found) == f"{name} {version}"
    assert mpis.flavour_of(found) == flavour
    assert site_mpi.mpi_identity(text) == (family, version)


def test_a_text_no_library_reads_is_no_mpi():
    for text in ("srun: unrecognized option '--version'", "", "Microsoft MPI 10.1.12498.18"):
        assert mpis.identify(text) is None and mpis.flavour_of(None) is None
        assert all(not f.covers(None) for f in mpis.FLAVOURS.values())


@pytest.mark.parametrize("text", LIBRARY_VERSIONS)
def test_the_ranks_check_takes_each_library_under_its_own_flavour_only(text):
    *_, own = LIBRARY_VERSIONS[text]
    for flavour, record in mpis.FLAVOURS.items():
        why = rank_check.mismatch(flavour, first_line(text))
        assert (why is None) == (flavour == own), (flavour, text, why)
        if why:
            assert why == f"not {record.words}"


@pytest.mark.parametrize("text, name", [(CRAY_MPICH, "Cray MPICH 8.1.27.26"),
                                        (MVAPICH2, "MVAPICH2 2.3.7")])
def test_cray_mpich_and_mvapich2_are_mpich_and_said_as_themselves(text, name, monkeypatch):
    assert rank_check.mismatch("mpich", first_line(text)) is None
    assert judge_mpi(0, text, "mpich") == ("pass", f"{name} (mpiexec --version)", "")
    status, detail, hint = judge_mpi(0, text, "openmpi")
    assert status == "fail" and detail.startswith(name) and "mpi.flavour is openmpi" in detail
    assert hint == "set mpi.flavour to mpich (the MPI on PATH), or load the Open MPI 4.x module"
    # the rank under an openmpi profile stops, quoting the library's words
    monkeypatch.setattr(rank_check, "profile_flavour", lambda run_dir: "openmpi")
    monkeypatch.setattr(rank_check, "loaded_libmpi", lambda: "/opt/mpi/lib/libmpi.so.12")
    monkeypatch.setattr(rank_check, "library_version", lambda path: first_line(text))
    with pytest.raises(UserError, match="links .*(CRAY MPICH|MVAPICH2).* not Open MPI 4.x"):
        rank_check.check("/run")


def test_the_rank_finds_cray_mpichs_library_by_its_own_names():
    maps = ("7f0-7f1 r-xp 0 08:01 1 /opt/libmpi_cxx.so.40\n"
            "7f2-7f3 r-xp 0 08:01 2 /opt/cray/pe/mpich/8.1.27/ofi/gnu/12.3/lib/libmpi_gnu_123.so.12\n")
    assert rank_check.loaded_libmpi(maps).endswith("/libmpi_gnu_123.so.12")
    assert rank_check.loaded_libmpi("7f0-7f1 r-xp 0 08:01 1 /x/libmpi_cray.so.12.0.0\n") == \
        "/x/libmpi_cray.so.12.0.0"
    assert rank_check.loaded_libmpi("7f0-7f1 r-xp 0 08:01 1 /x/libmpi_mpifh.so.40\n") is None


def fake_launcher(tmp_path, name, says):
    """PATH with only ``name``, which prints ``says`` for --version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / name
    program.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in says.splitlines()))
    program.chmod(0o755)
    return {"PATH": str(bin_dir)}


def test_open_mpi_6_is_openmpi5_to_all_four_readers(tmp_path):
    found = mpis.identify(OPEN_MPI_6)
    assert str(found) == "Open MPI 6.0.0" and mpis.flavour_of(found) == "openmpi5"
    # the rank
    assert rank_check.mismatch("openmpi5", first_line(OPEN_MPI_6)) is None
    assert rank_check.mismatch("openmpi", first_line(OPEN_MPI_6)) == "not Open MPI 4.x"
    # doctor's mpi line, and the local cluster's profile of the MPI on PATH
    said = "mpirun (Open MPI) 6.0.0\n\nReport bugs to https://www.open-mpi.org/community/help/"
    assert judge_mpi(0, said, "openmpi5")[0] == "pass"
    assert judge_mpi(0, said, "openmpi")[0] == "fail"
    assert site_mpi.flavour_on_path(fake_launcher(tmp_path, "mpirun", said)) == "openmpi5"
    # the launch line: PRRTE's, as Open MPI 5's
    assert isinstance(mpi_flavours.flavour(mpis.flavour_of(found)), mpi_flavours.OpenMpi5)


def test_every_reader_reads_the_one_table():
    assert set(mpi_flavours.FLAVOURS) == set(mpis.FLAVOURS)
    for name, cls in mpi_flavours.FLAVOURS.items():
        own = cls()
        assert cls.record is mpis.FLAVOURS[name] and own.name == name
        assert own.srun_mpi == mpis.FLAVOURS[name].srun_mpi
    literal = typing.get_type_hints(site_profile.Mpi)["flavour"]
    assert typing.get_args(literal) == tuple(mpis.FLAVOURS)
    assert site_profile.Mpi().flavour == mpis.DEFAULT
    for record in mpis.FLAVOURS.values():
        assert {library.family for library in record.libraries} == {record.family}
    taken = {library for record in mpis.FLAVOURS.values() for library in record.libraries}
    assert taken == set(mpis.LIBRARIES)


CRAY_FLAVOUR = mpis.MpiFlavour("craympich", "Cray MPICH", (mpis.CRAY_MPICH,), "srun", "cray_shasta")


@pytest.fixture
def a_flavour_added(monkeypatch):
    """A flavour in the table that no other module names (docs/ARCHITECTURE.md, "An MPI")."""
    monkeypatch.setitem(mpis.FLAVOURS, CRAY_FLAVOUR.name, CRAY_FLAVOUR)
    return CRAY_FLAVOUR


def test_doctor_asks_an_added_flavours_launcher_and_judges_it(a_flavour_added, monkeypatch):
    asked = []

    def run(argv, timeout=60, env=None):
        asked.append(argv)
        return 0, "srun: unrecognized option '--version'" if argv[0] == "srun" else MPICH

    monkeypatch.setattr(doctor, "_run", run)
    check = doctor.check_mpi(SimpleNamespace(mpi=SimpleNamespace(flavour="craympich")))
    assert asked == [["srun", "--version"]]
    assert check.status == "fail" and "says no MPI hpcsuite knows" in check.detail
    assert "craympich" in check.hint
    status, detail, hint = judge_mpi(0, MPICH, "craympich")
    assert status == "fail" and detail == "MPICH 4.0.2 (srun --version), but the profile's " \
        "mpi.flavour is craympich"
    assert hint == "set mpi.flavour to mpich (the MPI on PATH), or load the Cray MPICH module"
    assert judge_mpi(0, CRAY_MPICH, "craympich") == \
        ("pass", "Cray MPICH 8.1.27.26 (srun --version)", "")


def test_the_rank_checks_an_added_flavour(a_flavour_added, monkeypatch):
    monkeypatch.setattr(mpis, "BUILD_RECORDS", ())    # not this venv's own build record
    assert rank_check.mismatch("craympich", first_line(CRAY_MPICH)) is None
    assert rank_check.mismatch("craympich", first_line(MPICH)) == "not Cray MPICH"
    monkeypatch.setattr(rank_check, "profile_flavour", lambda run_dir: "craympich")
    monkeypatch.setattr(rank_check, "loaded_libmpi", lambda: "/usr/lib/libmpi.so.12")
    monkeypatch.setattr(rank_check, "library_version", lambda path: first_line(MPICH))
    with pytest.raises(UserError, match="craympich .* build Horovod against Cray MPICH"):
        rank_check.check("/run")
    monkeypatch.setattr(rank_check, "library_version", lambda path: first_line(CRAY_MPICH))
    rank_check.check("/run")


def test_an_added_open_mpi_flavour_reaches_the_cluster_profile(monkeypatch, tmp_path):
    """A flavour of the default's family at other versions, listed before openmpi5, is what
    `cluster up` writes for the Open MPI it covers."""
    six = dataclasses.replace(mpis.FLAVOURS["openmpi5"], name="openmpi6", words="Open MPI 6",
                              majors=(6, None))
    monkeypatch.setattr(mpis, "FLAVOURS", {"openmpi6": six, **mpis.FLAVOURS})
    said = "mpirun (Open MPI) 6.0.0\n"
    assert site_mpi.flavour_on_path(fake_launcher(tmp_path, "mpirun", said)) == "openmpi6"
    assert judge_mpi(0, said, "openmpi6")[0] == "pass"
    assert rank_check.mismatch("openmpi6", first_line(OPEN_MPI_5)) == "not Open MPI 6"
