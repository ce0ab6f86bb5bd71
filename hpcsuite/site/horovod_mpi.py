"""Does the Horovod in the job's Python link the MPI on PATH? `doctor`'s `horovod-mpi` check and
`hpcsuite-build-horovod`'s last step.

Horovod is compiled against one MPI (its ``mpi_lib*.so`` needs ``libmpi.so.N``); the ranks are
started by whichever ``mpirun``/``mpiexec`` the job's modules put on PATH. When the two differ
(a module swapped, a build made against the system's Open MPI 4 and a job under a module's
Open MPI 5) ranks fail at ``hvd.init()`` or each becomes a world of one. This asks, in the job's
Python, which ``libmpi`` Horovod's library resolves to under this environment (``ldd``) and what
that library says it is (``MPI_Get_library_version``, callable before ``MPI_Init``), and sets it
beside what the launcher on PATH says it is (``--version``). Nothing here imports a framework.

It also asks what that Horovod was built with (:func:`horovod_build`, doctor's `horovod` check
and a study's environment), the same way: a subprocess of the job's Python.
"""

from __future__ import annotations

import json
import os
import shutil

from .. import mpis, slurm
from ..errors import UserError

# Run in the job's Python: find Horovod's compiled libraries without importing horovod (which
# imports nothing heavy, but horovod.torch would import torch), resolve their libmpi with ldd
# under this environment, and ask that library its version.
LINK_PROBE = r"""
import ctypes, glob, importlib.util, json, os, re, subprocess
out = {}
spec = importlib.util.find_spec("horovod")
if spec is None or not spec.submodule_search_locations:
    out["error"] = "no horovod in this Python"
else:
    root = list(spec.submodule_search_locations)[0]
    libs = sorted(glob.glob(os.path.join(root, "*", "mpi_lib*.so")))
    out["libs"] = [os.path.relpath(l, root) for l in libs]
    found = {}
    for lib in libs:
        try:   # ldd of a library on a hung shared filesystem must not hang doctor
            ldd = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            out["ldd_error"] = type(e).__name__ + ": " + str(e)[:160]
            ldd = ""
        for m in re.finditer(r"^\s*(libmpi(?:cxx)?\.so[.\d]*)\s+=>\s+(\S+)", ldd, re.M):
            if m.group(1).startswith("libmpi.so"):
                found[m.group(1)] = m.group(2)
    out["libmpi"] = found
    for name, path in found.items():
        if path == "not":
            continue
        try:
            mpi = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            buf, n = ctypes.create_string_buffer(8192), ctypes.c_int(0)
            mpi.MPI_Get_library_version(buf, ctypes.byref(n))
            out["library_version"] = buf.value.decode(errors="replace")
            out["library_path"] = os.path.realpath(path)
        except Exception as e:
            out["library_error"] = type(e).__name__ + ": " + str(e)[:160]
        break
import sys
for stamp in (".hpcsuite-build-horovod-key", ".horovod-key"):   # the build's own record
    try:
        out["built_for"] = open(os.path.join(sys.prefix, stamp)).read().strip()[:300]
        out["built_record"] = os.path.join(sys.prefix, stamp)
        break
    except OSError:
        pass
print("HPCSUITE_LINK=" + json.dumps(out))
"""

LAUNCHERS = ("mpirun", "mpiexec")


def mpi_identity(text: str) -> tuple[str, str] | None:
    """(family, version) from a launcher's ``--version`` or a library's
    ``MPI_Get_library_version``: ('openmpi', '5.0.11'), ('mpich', '4.0.2') (Cray MPICH and
    MVAPICH2 too), ('intelmpi', '2021.19'); None when no library of :mod:`hpcsuite.mpis` reads
    it."""
    found = mpis.identify(text)
    return (found.library.family, found.version) if found else None


def launcher_on_path(path: str | None = None) -> tuple[str, str] | None:
    """(name, absolute path) of the first of mpirun, mpiexec on ``path`` (PATH), or None."""
    for name in LAUNCHERS:
        found = shutil.which(name, path=path)
        if found:
            return name, found
    return None


def launcher_identity(env: dict[str, str]) -> dict:
    """{launcher, path, family, version, flavour} of the MPI launcher on the environment's PATH
    (flavour: the mpi.flavour that covers it, or None), or {error}."""
    found = launcher_on_path(env.get("PATH"))
    if found is None:
        return {"error": "no mpirun or mpiexec on PATH"}
    name, path = found
    try:
        done = slurm.call([path, "--version"], timeout=30, env=env, check=False)
    except UserError as e:
        return {"error": f"{path} --version: {e}"}
    text = (done.stdout + done.stderr).strip()
    found = mpis.identify(text)
    if found is None:
        return {"error": f"{path} --version says no MPI hpcsuite knows: "
                         f"{(text.splitlines() or ['nothing'])[0][:120]}"}
    return {"launcher": name, "path": path, "family": found.library.family,
            "version": found.version, "flavour": mpis.flavour_of(found)}


def ask(argv: list[str], timeout: float = 60, env: dict | None = None) -> tuple[int, str]:
    """(exit code, stdout + stderr) through slurm.call; a missing program or a timeout is a
    check result (exit 127 / 124), not an error."""
    try:
        done = slurm.call(argv, timeout=timeout, env=env, check=False)
    except UserError as e:
        return (127 if "not found" in str(e) else 124), str(e)
    return done.returncode, (done.stdout + done.stderr).strip()


def horovod_link(python: str, env: dict[str, str]) -> dict:
    """:data:`LINK_PROBE`'s answer in ``python`` under ``env``: {libs, libmpi: {soname: path or
    'not'}, library_version, library_path} or {error}."""
    try:
        done = slurm.call([python, "-c", LINK_PROBE], timeout=60, env=env, check=False)
    except UserError as e:
        return {"error": str(e)}
    line = next((l for l in done.stdout.splitlines() if l.startswith("HPCSUITE_LINK=")), None)
    if line is None:
        out = (done.stdout + done.stderr).strip().splitlines()
        return {"error": f"{python}: {(out or [f'exit {done.returncode}'])[-1][:200]}"}
    return json.loads(line.split("=", 1)[1])


def judge(link: dict, launcher: dict) -> tuple[str, str, str]:
    """(status, detail, hint) of :func:`horovod_link` beside :func:`launcher_identity`; pure."""
    build = ("rebuild Horovod against the MPI the jobs load: module load it, then "
             "hpcsuite-build-horovod (docs/admin/install.md)")
    if "error" in link:
        return "fail", link["error"], "install Horovod: hpcsuite-build-horovod"
    if not link.get("libs"):
        return "fail", "Horovod has no MPI library (mpi_lib*.so): built without MPI", build
    if not link.get("libmpi"):
        return "fail", f"Horovod's {', '.join(link['libs'])} link no libmpi", build
    soname, where = next(iter(link["libmpi"].items()))
    if where == "not":
        return "fail", (f"Horovod needs {soname}, which is not found under this environment"), \
            ("load the MPI module Horovod was built against (or rebuild it against the one "
             "loaded: hpcsuite-build-horovod)")
    library = mpi_identity(link.get("library_version", ""))
    if library is None:
        return "warn", f"Horovod links {where}, which did not say its version " \
                       f"({link.get('library_error', 'no MPI_Get_library_version')})", ""
    lib = f"Horovod links {library[0]} {library[1]} ({link.get('library_path', where)})"
    built = mpis.built_against(link.get("built_for"))
    if built and not mpis.same_release(built, library):
        # the same soname resolves to another MPI (a module's LD_LIBRARY_PATH): Horovod was
        # compiled against the other one's headers and fails at once in the job
        return "fail", (f"Horovod was built against {built[0]} {built[1]} (its build record "
                        f"{link.get('built_record')}), but under this environment {soname} "
                        f"resolves to {library[0]} {library[1]} ({link.get('library_path', where)})"), \
            ("rebuild Horovod with the MPI the jobs load: module load it, then "
             "hpcsuite-build-horovod (docs/admin/install.md); or load the MPI it was built "
             "against")
    if "error" in launcher:
        return "fail", f"{lib}; {launcher['error']}", \
            "load the MPI module the jobs use (module load ...), or the site profile's modules:"
    run = f"{launcher['launcher']} on PATH is {launcher['family']} {launcher['version']} " \
          f"({launcher['path']})"
    if (library[0], library[1]) != (launcher["family"], launcher["version"]):
        return "fail", f"{lib}, but {run}", build
    return "pass", f"{lib}; {run}", ""


def check(python: str, env: dict[str, str] | None = None) -> tuple[str, str, str]:
    """(status, detail, hint): the job's Python's Horovod against the launcher on PATH."""
    env = dict(env if env is not None else os.environ)
    return judge(horovod_link(python, env), launcher_identity(env))


# What Horovod was built with, as `horovodrun --check-build` marks it, asked of each framework's
# Horovod module in a subprocess of its own, the two side by side: check-build asks each question
# in a subprocess of its own (36 s on the 2-core machine), this imports each framework once. No
# hvd.init() is needed; nccl_built() is NCCL_VERSION_CODE (2.28.3: 22803) or 0.
BUILD_PROBE = """
import json, sys
try:
    hvd = __import__("horovod." + sys.argv[1], fromlist=["init"])
    out = {q: int(getattr(hvd, q + "_built")() or 0)
           for q in ("mpi", "gloo", "nccl", "ddl", "ccl", "cuda", "rocm")}
except Exception as e:
    out = {"error": type(e).__name__ + ": " + str(e)[:160]}
print("HPCSUITE_BUILD=" + json.dumps(out))
"""
FRAMEWORKS = {"torch": "PyTorch", "tensorflow": "TensorFlow"}
CONTROLLERS = {"mpi": "MPI", "gloo": "Gloo"}
OPERATIONS = {"nccl": "NCCL", "ddl": "DDL", "ccl": "CCL", "mpi": "MPI", "gloo": "Gloo"}


def framework_build(python: str, module: str) -> dict:
    """horovod.<module>'s answers ({mpi, gloo, nccl, ddl, ccl, cuda, rocm}), or {error: why}."""
    code, out = ask([python, "-c", BUILD_PROBE, module], timeout=180,
                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    line = next((l for l in out.splitlines() if l.startswith("HPCSUITE_BUILD=")), None)
    if line is None:
        return {"error": (out.splitlines() or [f"exit {code}"])[-1][:200]}
    return json.loads(line.split("=", 1)[1])


def horovod_build(python: str) -> dict:
    """{frameworks, controllers, operations} (sets of check-build's names), ``missing`` (a
    framework's import error) and ``gpu`` (horovod.torch's answers: nccl, cuda, rocm, or its
    error); {error} when no framework's Horovod module imports."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(FRAMEWORKS)) as pool:
        answers = dict(zip(FRAMEWORKS, pool.map(lambda m: framework_build(python, m), FRAMEWORKS)))
    built = [a for a in answers.values() if "error" not in a]
    if not built:
        return {"error": "; ".join(f"horovod.{m}: {a['error']}" for m, a in answers.items())}
    return {"frameworks": {FRAMEWORKS[m] for m, a in answers.items() if "error" not in a},
            "controllers": {name for q, name in CONTROLLERS.items() if any(a[q] for a in built)},
            "operations": {name for q, name in OPERATIONS.items() if any(a[q] for a in built)},
            "missing": {FRAMEWORKS[m]: a["error"] for m, a in answers.items() if "error" in a},
            "gpu": answers["torch"]}


def describe_gpu_build(gpu: dict) -> str:
    """'GPU build: CUDA, NCCL 2.28.3' from horovod.torch's answers (:func:`horovod_build`)."""
    if "error" in gpu:
        return f"GPU build not known (horovod.torch: {gpu['error']})"
    code = int(gpu.get("nccl") or 0)
    nccl = f"NCCL {code // 10000}.{code // 100 % 100}.{code % 100}" if code >= 20900 else \
        f"NCCL {code // 1000}.{code // 100 % 10}.{code % 100}" if code else "no NCCL"
    device = "CUDA" if gpu.get("cuda") else "ROCm" if gpu.get("rocm") else "no CUDA"
    return f"GPU build: {device}, {nccl}"


def flavour_on_path(env: dict[str, str]) -> str | None:
    """The ``mpi.flavour`` of the MPI launcher on the environment's PATH when it is the default
    flavour's family at other versions: openmpi5 for Open MPI 5 or later (Debian 13's 5), whose
    ranks a profile saying openmpi refuses; None otherwise (the local cluster's profile then
    says nothing)."""
    flavour = launcher_identity(env).get("flavour")
    default = mpis.FLAVOURS[mpis.DEFAULT]
    if flavour and flavour != default.name and mpis.FLAVOURS[flavour].family == default.family:
        return flavour
    return None
