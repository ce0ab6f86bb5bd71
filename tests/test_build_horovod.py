"""scripts/build_horovod.sh's decisions, without building: where it finds CUDA and NCCL, which
compute capabilities it builds for, the GPU part of setup.sh's wheel cache key, and its patches
on the real sdist. The GPU build itself runs on a lent GPU machine (bench/gpu_check.sh)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "build_horovod.sh"
NCCL_H = "#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 3\n#define NCCL_SUFFIX \"\"\n"


def program(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path):
    """A CUDA toolkit whose nvcc says 12.4, and a PATH whose nvidia-smi lists three GPUs."""
    cuda = tmp_path / "cuda"
    program(cuda / "bin" / "nvcc", "echo 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    (cuda / "include").mkdir()
    program(tmp_path / "bin" / "nvidia-smi", "printf '9.0\\n8.0\\n9.0\\n'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CUDA_"))}
    env.update(HOROVOD_CUDA_HOME=str(cuda), PY=sys.executable,
               PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}")
    return tmp_path, env


def describe(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--describe"], env=env, capture_output=True,
                          text=True, timeout=120)


def nccl_tree(root: Path, lib: str = "lib") -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "nccl.h").write_text(NCCL_H)
    (root / lib).mkdir(parents=True)
    (root / lib / "libnccl.so.2").write_bytes(b"")     # no libnccl.so link: the runtime package
    return root


def test_nccl_home_cuda_and_the_gpus_present_make_the_key(machine):
    tmp, env = machine
    env["HOROVOD_NCCL_HOME"] = str(nccl_tree(tmp / "nccl"))
    done = describe(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cuda-12.4_nccl-2.28.3_cc-80-90\n"
    assert f"NCCL 2.28.3 from HOROVOD_NCCL_HOME ({tmp}/nccl/include/nccl.h, " \
           f"{tmp}/nccl/lib/libnccl.so.2)" in done.stderr
    assert "compute capabilities 80,90 from the GPUs present (nvidia-smi)" in done.stderr
    env["HOROVOD_BUILD_CUDA_CC_LIST"] = "75"
    assert describe(env).stdout == "cuda-12.4_nccl-2.28.3_cc-75\n"


@pytest.mark.skipif(Path("/usr/include/nccl.h").exists() or Path("/usr/local/include/nccl.h").exists(),
                    reason="this machine has a system NCCL, which comes before the pip package")
def test_nccl_from_the_pip_package_beside_torch(machine):
    tmp, env = machine
    nccl_tree(tmp / "site" / "nvidia" / "nccl")
    env["PYTHONPATH"] = str(tmp / "site")           # nvidia/ is a namespace package, as installed
    done = describe(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cuda-12.4_nccl-2.28.3_cc-80-90\n"
    assert f"from pip (nvidia-nccl) ({tmp}/site/nvidia/nccl/include/nccl.h" in done.stderr


@pytest.mark.skipif(Path("/usr/include/nccl.h").exists() or Path("/usr/local/include/nccl.h").exists(),
                    reason="this machine has a system NCCL")
def test_no_nccl_says_where_it_looked_and_how_to_point_at_one(machine):
    tmp, env = machine
    done = describe(env)
    assert done.returncode == 1 and done.stdout == ""
    assert "error: no NCCL: looked for nccl.h in /usr/include" in done.stderr
    assert "set HOROVOD_NCCL_HOME" in done.stderr
    env["HOROVOD_NCCL_HOME"] = str(tmp / "nowhere")
    assert "HOROVOD_NCCL_HOME=" + str(tmp / "nowhere") + " has no include/nccl.h" in describe(env).stderr


def test_without_gpus_or_a_cuda_torch_the_capabilities_must_be_named(machine):
    tmp, env = machine
    env["HOROVOD_NCCL_HOME"] = str(nccl_tree(tmp / "nccl", "lib64"))
    program(tmp / "bin" / "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9\n")
    env["PY"] = str(program(tmp / "py", "exit 1\n"))          # a Python without torch
    done = describe(env)
    assert done.returncode == 1
    assert "no compute capability" in done.stderr and "HOROVOD_BUILD_CUDA_CC_LIST" in done.stderr
    env["HOROVOD_BUILD_CUDA_CC_LIST"] = "90,100"
    assert describe(env).stdout == "cuda-12.4_nccl-2.28.3_cc-90-100\n"


def test_no_cuda_toolkit_is_one_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CUDA_"))}
    env.update(HOROVOD_CUDA_HOME=str(tmp_path), CUDA_HOME=str(tmp_path), PATH="/usr/bin:/bin")
    if Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("/usr/local/cuda has an nvcc here")
    done = describe(env)
    assert done.returncode == 1 and "error: no CUDA toolkit" in done.stderr


SDIST = Path(os.environ.get("HPCSUITE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or
             Path.home() / ".cache") / "hpcsuite") / "sdist" / "horovod-0.28.1.tar.gz"


@pytest.mark.skipif(not SDIST.is_file(), reason=f"no {SDIST} (scripts/setup.sh keeps it there)")
def test_the_patches_apply_to_the_horovod_sdist(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--patch", str(SDIST), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    src = tmp_path / "horovod-0.28.1"
    assert "set(CMAKE_CXX_STANDARD 17)" in (src / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in (src / "horovod/torch/CMakeLists.txt").read_text()
    assert "xla_mpi_ops.cc" not in (src / "horovod/tensorflow/CMakeLists.txt").read_text()
    assert "setup_requires=[]," in (src / "setup.py").read_text()
    assert "#include <mutex>\n#include <string>\n" in (src / "horovod/common/group_table.h").read_text()
    assert "#include <functional>\n#include <stdexcept>\n" in (src / "horovod/common/common.h").read_text()
    assert "set(CMAKE_CUDA_STANDARD 17)" in (src / "horovod/common/ops/cuda/CMakeLists.txt").read_text()
