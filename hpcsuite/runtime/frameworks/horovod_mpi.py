"""Whether the Horovod a rank imported links the MPI its site profile names (``mpi.flavour``).

Horovod links one MPI library when it is built. A rank whose Horovod links another MPI than
the one whose launcher started it does not join the job's world: Open MPI's library started by
MPICH's mpiexec (or the other way round) initialises as a world of one and trains alone, and
Open MPI 4.1's library under Open MPI 5's daemons fails in its PMIx handshake. So each rank
checks before ``hvd.init()``: it asks the MPI library its Horovod loaded for its version
(``MPI_Get_library_version`` may be called before ``MPI_Init``) and stops with one line naming
the profile key and the fix. It is checked here rather than at submit because only the rank
sees the library its job's environment (modules, the profile's setup lines) resolves. What each
flavour's library says of itself is :mod:`hpcsuite.mpis`'s, the table doctor and lint read too.
"""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path

from ... import mpis
from ...errors import UserError

# Open MPI's, MPICH's, MVAPICH2's and Intel MPI's libmpi.so.N, and Cray MPICH's
# libmpi_cray.so.12, libmpi_gnu_123.so.12 (one per compiler); not Open MPI's C++ or Fortran
# bindings (libmpi_cxx, libmpi_mpifh), which ask libmpi.so
LIBMPI = r".*/libmpi(_(cray|gnu_\d+|intel|nvidia|amd|aocc))?\.so(\.\d+)*"


def loaded_libmpi(maps: str | None = None) -> str | None:
    """The MPI library this process has loaded (the first :data:`LIBMPI` in /proc/self/maps)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and re.fullmatch(LIBMPI, fields[5].strip()):
            return fields[5].strip()
    return None


def library_version(path: str) -> str | None:
    """The first line of ``MPI_Get_library_version`` of the library at ``path``."""
    try:
        get = ctypes.CDLL(path).MPI_Get_library_version
    except (OSError, AttributeError):
        return None
    buf, length = ctypes.create_string_buffer(8192), ctypes.c_int(0)
    if get(buf, ctypes.byref(length)) != 0:
        return None
    return buf.value.decode(errors="replace").strip().splitlines()[0].strip()


def mismatch(flavour: str, version: str) -> str | None:
    """Why a library saying ``version`` is not the ``flavour``'s MPI (None: it is, or the
    flavour is none :data:`hpcsuite.mpis.FLAVOURS` knows)."""
    want = mpis.FLAVOURS.get(flavour)
    if want is None or want.covers(mpis.identify(version)):
        return None
    return f"not {want.words}"


def built_mismatch(path: str, version: str | None) -> None:
    """Refuse when the libmpi this rank loaded is another MPI release than the one its
    Horovod's build record names (a module's LD_LIBRARY_PATH making the same soname resolve to
    another Open MPI): Horovod fails at once in MPI_Init otherwise, with no word of why."""
    import sys

    found = mpis.identify(version or "")
    for name in mpis.BUILD_RECORDS:
        try:
            key = (Path(sys.prefix) / name).read_text().strip()
        except OSError:
            continue
        built = mpis.built_against(key)
        if built and found and not mpis.same_release(built, (found.library.family, found.version)):
            raise UserError(
                f"this rank's Horovod was built against {built[0]} {built[1]} (its build record "
                f"{Path(sys.prefix) / name}), but it loaded {found} from {path} (the environment's "
                "LD_LIBRARY_PATH, a module the job loads): rebuild Horovod with the MPI the jobs "
                "load (module load it, then hpcsuite-build-horovod), or load the MPI it was built "
                "against")
        return


def profile_flavour(run_dir: str | None) -> str | None:
    """The ``mpi.flavour`` of the site profile the job was submitted with (its run directory's
    profile.json); None when it cannot be read (a job started by hand)."""
    from ...runs.rundir import RunDir

    if not run_dir:
        return None
    try:
        return json.loads(RunDir(run_dir).profile.read_text())["mpi"]["flavour"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check(run_dir: str | None, horovod_file: str | None = None) -> None:
    """Refuse to start when the MPI library this rank's Horovod loaded is not the profile's.

    Call it after ``import horovod.<framework>`` (which loads Horovod's MPI library) and before
    ``hvd.init()``. Nothing is said when the flavour or the library cannot be known."""
    flavour = profile_flavour(run_dir)
    path = loaded_libmpi()
    if path is None:
        return
    version = library_version(path)
    why = mismatch(flavour, version) if version and flavour else None
    if why is None:
        built_mismatch(path, version)
        return
    words = mpis.FLAVOURS[flavour].words
    where = f" ({Path(horovod_file).parent})" if horovod_file else ""
    said = " ".join(version.split(",")[0].split())   # the library's own words
    raise UserError(
        f"mpi.flavour: {flavour} (the site profile), but this rank's Horovod{where} links "
        f"{said} at {path}, {why}: build Horovod against {words} into the "
        f"profile's python (hpcsuite-build-horovod there with that MPI's module loaded; "
        f"scripts/setup.sh --mpi {flavour} on the local cluster), or set "
        "mpi.flavour and python to an MPI and interpreter that go together")
