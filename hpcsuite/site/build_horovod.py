"""`hpcsuite-build-horovod`: build Horovod into the Python it runs under, against the MPI (and,
with HOROVOD_GPU_OPERATIONS=NCCL, the CUDA and NCCL) that `module load` put on PATH; no root, no
apt. The wheel is cached under the key of what it was built against, so the next venv with the
same frameworks and MPI installs it in seconds. Then it checks what `doctor` checks: Horovod has
MPI and each installed framework, and links the MPI on PATH.

An entry point of its own, not a `hpcsuite` command: it runs once per install, in the venv whose
torch/TensorFlow it builds against (the CLI's commands are login-node readers that import no
framework and run no compiler). The patches and the build are scripts/build_horovod.sh, shipped
in the wheel as hpcsuite/site/build_horovod.sh (one recipe for setup.sh, the containers and this).

    hpcsuite-build-horovod [--sdist FILE] [--cache DIR] [--rebuild]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from . import horovod_mpi

HOROVOD_VERSION = "0.28.1"
SCRIPT = Path(__file__).with_name("build_horovod.sh")
# Horovod's runtime needs, without letting pip touch torch or TensorFlow (setup.sh's list).
RUNTIME_DEPS = ["cloudpickle", "psutil", "pyyaml", "packaging", "cffi"]
FRAMEWORKS = {"torch": ("torch",), "tf": ("tensorflow-cpu", "tensorflow")}
# In the venv, once its Horovod passed the checks: the key it was built for (setup.sh keeps its
# own .horovod-key beside it, in its own format).
STAMP = ".hpcsuite-build-horovod-key"


class BuildError(Exception):
    """One line for the user; exit 2."""


def say(text: str) -> None:
    print(f"[hpcsuite-build-horovod] {text}", file=sys.stderr, flush=True)


def installed(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return version(name).split("+")[0]
        except PackageNotFoundError:
            continue
    return None


def cache_root(given: str | None) -> Path:
    return Path(given or os.environ.get("HPCSUITE_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcsuite")


def build_key(frameworks: dict[str, str | None], mpi: dict, gpu: str = "") -> str:
    """horovod-0.28.1_torch-2.13.0_tf-none_cp311_openmpi-5.0.11-<8 hex of its directory>: the MPI's
    directory is part of it, as Open MPI's wrappers record it in the library (RUNPATH)."""
    where = hashlib.sha256(str(Path(mpi["path"]).resolve().parent).encode()).hexdigest()[:8]
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    parts = [f"horovod-{HOROVOD_VERSION}", *(f"{k}-{v or 'none'}" for k, v in frameworks.items()),
             py, f"{mpi['family']}-{mpi['version']}-{where}"]
    return "_".join(parts) + (f"_gpu-nccl_{gpu}" if gpu else "")


def sdist(cache: Path, given: str | None) -> Path:
    if given:
        if not Path(given).is_file():
            raise BuildError(f"--sdist {given}: no such file")
        return Path(given)
    cached = cache / "sdist" / f"horovod-{HOROVOD_VERSION}.tar.gz"
    if not cached.is_file():
        say(f"downloading the horovod {HOROVOD_VERSION} sdist into {cached.parent}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        pip(["download", "-q", "--no-binary", ":all:", "--no-deps", "-d", str(cached.parent),
             f"horovod=={HOROVOD_VERSION}"], "cannot download the horovod sdist (no network? "
            "copy horovod-0.28.1.tar.gz here and pass --sdist FILE)")
    return cached


def pip(args: list[str], what: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = [l for l in done.stderr.splitlines() if not l.startswith("WARNING")] or ["?"]
        raise BuildError(f"{what}: pip: {last[-1]}")


def gpu_part(env: dict[str, str]) -> str:
    if env.get("HOROVOD_GPU_OPERATIONS", "none").upper() != "NCCL":
        return ""
    done = subprocess.run(["bash", str(SCRIPT), "--describe"], capture_output=True, text=True,
                          env=dict(env, PY=sys.executable))
    if done.returncode != 0:
        said = done.stderr.strip().split("[build_horovod] error: ")[-1] or "--describe failed"
        raise BuildError(f"HOROVOD_GPU_OPERATIONS=NCCL: {' '.join(said.split())}")
    return done.stdout.strip()


def build(source: Path, wheels: Path, frameworks: dict, env: dict[str, str], log: Path) -> None:
    flags = {"HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MXNET": "1",
             "HOROVOD_CPU_OPERATIONS": "MPI", "MAKEFLAGS": f"-j{os.cpu_count() or 1}",
             "PY": sys.executable,
             "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    for key, name in (("torch", "PYTORCH"), ("tf", "TENSORFLOW")):
        flags[f"HOROVOD_{'WITH' if frameworks[key] else 'WITHOUT'}_{name}"] = "1"
    for tool in ("cmake", "mpicxx"):
        if not shutil.which(tool, path=flags["PATH"]):
            raise BuildError(f"no {tool} on PATH: module load cmake and the MPI (or pip install "
                             "cmake into this venv)")
    with open(log, "w") as out:
        done = subprocess.run(["bash", str(SCRIPT), str(source), str(wheels)],
                              env={**env, **flags}, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        raise BuildError(f"the Horovod build failed (the end of {log} is above)")


def run(args: argparse.Namespace) -> None:
    env = dict(os.environ)
    frameworks = {k: installed(names) for k, names in FRAMEWORKS.items()}
    if not any(frameworks.values()):
        raise BuildError(f"{sys.executable} has neither torch nor TensorFlow: install one first "
                         "(docs/admin/install.md)")
    mpi = horovod_mpi.launcher_identity(env)
    if "error" in mpi:
        raise BuildError(f"{mpi['error']}: module load the MPI the jobs will use first")
    cache = cache_root(args.cache)
    key = build_key(frameworks, mpi, gpu_part(env))
    stamp = Path(sys.prefix) / STAMP
    if not args.rebuild and stamp.is_file() and stamp.read_text().strip() == key:
        say(f"Horovod {HOROVOD_VERSION} is installed for this key ({key})")
    else:
        wheels = cache / "wheels" / key
        if args.rebuild or not list(wheels.glob("horovod-*.whl")):
            wheels.mkdir(parents=True, exist_ok=True)
            source = sdist(cache, args.sdist)
            say(f"building Horovod {HOROVOD_VERSION} against {mpi['family']} {mpi['version']} "
                f"({mpi['path']}); minutes")
            started = time.monotonic()
            with tempfile.TemporaryDirectory() as tmp:
                build(source, Path(tmp), frameworks, env, wheels / "build.log")
                for whl in Path(tmp).glob("horovod-*.whl"):   # whole or not at all
                    shutil.copy2(whl, wheels / f".{whl.name}.partial")
                    os.replace(wheels / f".{whl.name}.partial", wheels / whl.name)
            say(f"built in {time.monotonic() - started:.0f} s; cached in {wheels}")
        whl = sorted(wheels.glob("horovod-*.whl"))[-1]
        say(f"installing {whl}")
        pip(["install", "-q", "--no-deps", "--force-reinstall", str(whl)], "cannot install it")
        pip(["install", "-q", *RUNTIME_DEPS], "cannot install Horovod's runtime needs")
    status, detail, hint = horovod_mpi.check(sys.executable, env)
    if status == "fail":
        stamp.unlink(missing_ok=True)
        raise BuildError(f"{detail}; {hint}")
    missing = [name for name, module in (("torch", "torch"), ("tf", "tensorflow"))
               if frameworks[name] and not framework_built(module)]
    if missing:
        stamp.unlink(missing_ok=True)
        raise BuildError(f"the installed Horovod lacks {', '.join(missing)}; rerun with --rebuild")
    stamp.write_text(key + "\n")
    say(f"ready: {detail}")


def framework_built(module: str) -> bool:
    """horovod.<module> imports and has MPI (what `horovodrun --check-build` marks, asked as
    `doctor` asks it)."""
    return bool(horovod_mpi.framework_build(sys.executable, module).get("mpi"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hpcsuite-build-horovod", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdist", help="Horovod's sdist (default: cached, else downloaded)")
    parser.add_argument("--cache", help="the wheel cache (default: $HPCSUITE_CACHE, "
                        "~/.cache/hpcsuite)")
    parser.add_argument("--rebuild", action="store_true", help="build even when cached")
    try:
        run(parser.parse_args(argv))
    except BuildError as e:
        print(f"hpcsuite-build-horovod: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
