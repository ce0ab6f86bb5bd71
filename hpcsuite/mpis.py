"""What an MPI is: one record per ``mpi.flavour``, read by everything that must agree on it.

An MPI says which it is in words: ``MPI_Get_library_version`` (what a rank asks the library its
Horovod loaded), its launcher's ``--version`` (what doctor asks), ``ompi_info``,
``mpichversion``. A :class:`Library` reads one product's words; a flavour (:class:`MpiFlavour`)
accepts the libraries of its family at the major versions it covers and names its own launcher
and srun plugin. Lint and the launch lines (``submit/mpi_flavours.py``), doctor
(``site/slurm_versions.py``, ``site/horovod_mpi.py``) and the rank's check before ``hvd.init()``
(``runtime/frameworks/horovod_mpi.py``) all read :data:`FLAVOURS`, so a flavour added here is
known to each of them, and Open MPI 6 is the same flavour to all four (``openmpi5``: PRRTE's
launcher, as 5's).

Cray MPICH and MVAPICH2 are MPICH underneath (its ABI, ``libmpi.so.12``, its PMI): the ``mpich``
flavour takes them, and messages name them as themselves. Intel MPI is MPICH-derived too but
launched and pinned its own way, so it is a flavour of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Library:
    """One MPI product, as its version text names it."""

    name: str      # in messages: "Cray MPICH"
    family: str    # whose ABI and launcher it has: openmpi, mpich, intelmpi
    pattern: str   # its version is the first group that matched

    def version_in(self, text: str) -> str | None:
        found = re.search(self.pattern, text, re.M)
        return next(g for g in found.groups() if g) if found else None


@dataclass(frozen=True)
class Found:
    """A library and the version its text says: ``str`` is "Cray MPICH 8.1.27.26"."""

    library: Library
    version: str

    @property
    def major(self) -> int:
        return int(re.match(r"\d+", self.version).group())

    def __str__(self) -> str:
        return f"{self.library.name} {self.version}"


# The words of each, from the real programs: MPI_Get_library_version's first line, the launcher's
# --version, ompi_info, mpichversion and MVAPICH2's mpiname (tests/test_mpi_identity.py holds them).
OPEN_MPI = Library("Open MPI", "openmpi",
                   r"\(Open MPI\)\s+v?(\d[\w.]*)|Open MPI v(\d[\w.]*)|^\s*Open MPI:\s+v?(\d[\w.]*)")
INTEL_MPI = Library("Intel MPI", "intelmpi", r"Intel\(R\) MPI Library[^\d]*?(\d+(?:\.\d+)*)")
CRAY_MPICH = Library("Cray MPICH", "mpich", r"CRAY MPICH version (\d[\w.]*)")
MVAPICH2 = Library("MVAPICH2", "mpich", r"MVAPICH2 Version\s*:\s*(\d[\w.]*)|^MVAPICH2 (\d[\w.]*)")
MPICH = Library("MPICH", "mpich",
                r"MPICH Version:\s+(\d[\w.]*)|HYDRA build details:[\s\S]*?Version:\s+(\d[\w.]*)")
# asked in this order, the most particular first (Cray MPICH's text says MPICH too)
LIBRARIES = (INTEL_MPI, CRAY_MPICH, MVAPICH2, MPICH, OPEN_MPI)


@dataclass(frozen=True)
class MpiFlavour:
    """What one ``mpi.flavour`` is: the libraries it accepts at which major versions, and how it
    starts ranks (its launch line is ``submit/mpi_flavours.py``'s class of the same name)."""

    name: str                        # the site profile's mpi.flavour
    words: str                       # in messages: "Open MPI 4.x"
    libraries: tuple[Library, ...]   # one family's
    launcher: str                    # its own launcher (launcher: mpirun): mpirun or mpiexec
    srun_mpi: str                    # srun --mpi unless the profile says
    majors: tuple[int, int | None] = (0, None)   # major versions covered: from, up to (None: all)

    @property
    def family(self) -> str:
        return self.libraries[0].family

    def covers(self, found: Found | None) -> bool:
        """Is ``found`` (None: a text no library reads) this flavour's MPI?"""
        low, high = self.majors
        return found is not None and found.library in self.libraries and \
            low <= found.major and (high is None or found.major < high)


FLAVOURS: dict[str, MpiFlavour] = {f.name: f for f in (
    MpiFlavour("openmpi", "Open MPI 4.x", (OPEN_MPI,), "mpirun", "pmix", majors=(0, 5)),
    # PRRTE's mpirun from 5 on (ORTE is gone): 6 launches as 5 does
    MpiFlavour("openmpi5", "Open MPI 5 or later", (OPEN_MPI,), "mpirun", "pmix", majors=(5, None)),
    MpiFlavour("mpich", "MPICH", (MPICH, CRAY_MPICH, MVAPICH2), "mpiexec", "pmi2"),
    MpiFlavour("intelmpi", "Intel MPI", (INTEL_MPI,), "mpiexec", "pmi2"),
)}
DEFAULT = "openmpi"   # the site profile's default mpi.flavour


def identify(text: str) -> Found | None:
    """The library and version ``text`` names (None: none hpcsuite knows)."""
    for library in LIBRARIES:
        version = library.version_in(text)
        if version:
            return Found(library, version)
    return None


def flavour_of(found: Found | None) -> str | None:
    """The first flavour in :data:`FLAVOURS` that covers ``found``, or None."""
    return next((name for name, flavour in FLAVOURS.items() if flavour.covers(found)), None)


# A Horovod build's record (setup.sh's .horovod-key, hpcsuite-build-horovod's stamp, in the
# venv): its key names the MPI it was compiled against, ..._openmpi-4.1.4[-HASH].
BUILD_RECORDS = (".hpcsuite-build-horovod-key", ".horovod-key")
_BUILT = re.compile(r"_(openmpi|mpich|intelmpi)-(\d+(?:\.\d+)*)")


def built_against(key: str | None) -> tuple[str, str] | None:
    """(family, version) of the MPI a Horovod build record's key names, or None."""
    m = _BUILT.search(key or "")
    return (m.group(1), m.group(2)) if m else None


def same_release(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two (family, version) are one MPI release (major.minor): Horovod compiled
    against one runs with the other."""
    return a[0] == b[0] and a[1].split(".")[:2] == b[1].split(".")[:2]
