#!/usr/bin/env bash
# Build a Horovod wheel from its sdist with the patches today's toolchains need, CPU-only or with
# NCCL GPU operations. scripts/setup.sh calls it (and caches the wheel); bench/gpu_check.sh calls
# it on a lent GPU machine, offline, from a carried sdist.
#
#   scripts/build_horovod.sh SDIST WHEEL_DIR   patch and build; the wheel lands in WHEEL_DIR
#   scripts/build_horovod.sh --describe        (GPU builds) print the wheel cache key's GPU part,
#                                              e.g. cuda-13.0_nccl-2.28.3_cc-90, and exit
#
# Environment:
#   PY                         the Python whose torch/TensorFlow Horovod is built against (python3)
#   HOROVOD_GPU_OPERATIONS     NCCL: build the GPU operations with CUDA and NCCL; unset/none: CPU
#   HOROVOD_WITH_*, HOROVOD_WITHOUT_*, HOROVOD_CPU_OPERATIONS, MAKEFLAGS: handed to Horovod's build
#   HOROVOD_CUDA_HOME          the CUDA toolkit (default: CUDA_HOME, /usr/local/cuda, nvcc's)
#   HOROVOD_NCCL_HOME          NCCL's prefix (include/nccl.h, lib/libnccl.so*); default: found in
#                              the system (nccl.h + libnccl.so.2, as the libnccl2/-dev packages and
#                              NVIDIA's containers install it), the CUDA toolkit, or the
#                              nvidia-nccl-cu12/-cu13 pip package beside torch
#   HOROVOD_BUILD_CUDA_CC_LIST compute capabilities to build for, e.g. 90 or 80,90 (default: those
#                              of the GPUs present (nvidia-smi), else torch's arch list; Horovod's
#                              own default, every arch nvcc knows, fails on CUDA 13)
set -euo pipefail

PY=${PY:-python3}
say() { printf '[build_horovod] %s\n' "$*" >&2; }
die() { printf '[build_horovod] error: %s\n' "$*" >&2; exit 1; }

gpu_ops=${HOROVOD_GPU_OPERATIONS:-none}
[[ ${gpu_ops,,} == none || ${gpu_ops^^} == NCCL ]] \
  || die "HOROVOD_GPU_OPERATIONS=$gpu_ops: this script builds NCCL or none"

# ---------------------------------------------------------------- what a GPU build needs
cuda_home() {
  local c
  for c in "${HOROVOD_CUDA_HOME:-}" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [[ -n $c && -x $c/bin/nvcc ]] && { echo "$c"; return; }
  done
  c=$(command -v nvcc 2>/dev/null) || return 1
  c=$(dirname "$(dirname "$(readlink -f "$c")")")     # a wrapper script: check for the headers
  [[ -x $c/bin/nvcc && -f $c/include/cuda_runtime.h ]] && echo "$c"
}

cuda_version() {   # "13.0" from `nvcc --version`'s "release 13.0, V13.0.88"
  "$1/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1
}

# NCCL_INCLUDE (the directory of nccl.h), NCCL_LIBFILE (libnccl.so or .so.2), NCCL_FROM (words)
find_nccl() {
  local inc lib d
  NCCL_INCLUDE='' NCCL_LIBFILE='' NCCL_FROM=''
  if [[ -n ${HOROVOD_NCCL_HOME:-} ]]; then
    [[ -f $HOROVOD_NCCL_HOME/include/nccl.h ]] || die "HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME has no include/nccl.h"
    for lib in "$HOROVOD_NCCL_HOME"/{lib,lib64,lib/x86_64-linux-gnu}/libnccl.so{,.2}; do
      [[ -e $lib ]] && { NCCL_INCLUDE=$HOROVOD_NCCL_HOME/include NCCL_LIBFILE=$lib NCCL_FROM="HOROVOD_NCCL_HOME"; return; }
    done
    die "HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME has no lib/libnccl.so or lib/libnccl.so.2"
  fi
  local cuda=$1 multiarch
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  for inc in /usr/include /usr/local/include "$cuda/include"; do
    [[ -f $inc/nccl.h ]] || continue
    for d in "/usr/lib/$multiarch" /usr/lib64 /usr/lib /usr/local/lib "$cuda/lib64" "$cuda/lib"; do
      for lib in "$d/libnccl.so" "$d/libnccl.so.2"; do
        [[ -e $lib ]] && { NCCL_INCLUDE=$inc NCCL_LIBFILE=$lib NCCL_FROM="the system"; return; }
      done
    done
  done
  # The pip package torch's CUDA wheels depend on: nvidia/nccl/{include,lib} in site-packages.
  d=$("$PY" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null) || d=''
  if [[ -n $d && -f $d/include/nccl.h ]]; then
    for lib in "$d/lib/libnccl.so" "$d/lib/libnccl.so.2"; do
      [[ -e $lib ]] && { NCCL_INCLUDE=$d/include NCCL_LIBFILE=$lib NCCL_FROM="pip (nvidia-nccl)"; return; }
    done
  fi
  die "no NCCL: looked for nccl.h in /usr/include, /usr/local/include, $cuda/include and the
  nvidia-nccl pip package of $PY, with libnccl.so(.2) beside it; set HOROVOD_NCCL_HOME to NCCL's
  prefix, or install libnccl2 + libnccl-dev (or pip install nvidia-nccl-cu12 / -cu13)"
}

nccl_version() {   # "2.28.3" from nccl.h's NCCL_MAJOR/MINOR/PATCH
  awk '$1 == "#define" && $2 ~ /^NCCL_(MAJOR|MINOR|PATCH)$/ {v[$2] = $3}
       END {if (v["NCCL_MAJOR"] != "") print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"]}' "$1/nccl.h"
}

# CC_LIST ("80,90") and CC_FROM: the GPUs present, else torch's arch list
find_cc_list() {
  if [[ -n ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
    CC_LIST=$HOROVOD_BUILD_CUDA_CC_LIST CC_FROM="HOROVOD_BUILD_CUDA_CC_LIST"; return
  fi
  CC_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
            | tr -d ' .' | grep -E '^[0-9]+$' | sort -n -u | paste -sd, -) || CC_LIST=''
  CC_FROM="the GPUs present (nvidia-smi)"
  if [[ -z $CC_LIST ]]; then
    CC_LIST=$("$PY" -c 'import torch; print(",".join(sorted({a[3:] for a in torch.cuda.get_arch_list() if a.startswith("sm_")}, key=int)))' 2>/dev/null) || CC_LIST=''
    CC_FROM="torch.cuda.get_arch_list()"
  fi
  [[ -n $CC_LIST ]] || die "no compute capability: no GPU answers nvidia-smi and torch has no CUDA arch list; set HOROVOD_BUILD_CUDA_CC_LIST (e.g. 90)"
}

gpu_describe() {   # sets CUDA, CUDA_VERSION, NCCL_*, NCCL_VERSION, CC_*; prints the key part
  CUDA=$(cuda_home) || die "no CUDA toolkit: no nvcc in HOROVOD_CUDA_HOME, CUDA_HOME, /usr/local/cuda or on PATH"
  CUDA_VERSION=$(cuda_version "$CUDA")
  find_nccl "$CUDA"
  NCCL_VERSION=$(nccl_version "$NCCL_INCLUDE")
  [[ -n $NCCL_VERSION ]] || die "$NCCL_INCLUDE/nccl.h names no NCCL_MAJOR/MINOR/PATCH"
  find_cc_list
  say "CUDA $CUDA_VERSION at $CUDA; NCCL $NCCL_VERSION from $NCCL_FROM ($NCCL_INCLUDE/nccl.h, $NCCL_LIBFILE); compute capabilities $CC_LIST from $CC_FROM"
  echo "cuda-${CUDA_VERSION}_nccl-${NCCL_VERSION}_cc-${CC_LIST//,/-}"
}

unpack() {   # unpack SDIST DIR: the sdist's horovod-*/ directory under DIR, printed
  local src
  [[ -f $1 ]] || die "$1: no such file"
  tar -xzf "$1" -C "$2"
  src=$(find "$2" -mindepth 1 -maxdepth 1 -type d -name 'horovod-*' | head -n1)
  [[ -f $src/setup.py ]] || die "$1 holds no horovod-*/setup.py"
  echo "$src"
}

patch_source() {
  local src=$1
  # 1: torch >= 2.1 headers require C++17; Horovod 0.28.1 compiles its torch extension as C++14
  #    (fixed upstream after 0.28.1, never released).
  # 2: the whole project must be C++17 too, or gloo (C++14) and the torch extension (C++17) both
  #    define gloo::rendezvous::Store::kDefaultTimeout and the link fails.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/horovod/torch/CMakeLists.txt" "$src/CMakeLists.txt"
  # 3: TensorFlow >= 2.16 wheels lack the highwayhash/farmhash headers that the optional XLA ops
  #    include; drop xla_mpi_ops.cc (hpcsuite does not use Horovod's XLA ops).
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  # 4: setup_requires cffi is never used by the build, and setuptools fetches it from the network
  #    at build time (fails offline); install_requires keeps it.
  sed -i 's/setup_requires=require_list if is_build_action() else \[\]/setup_requires=[]/' "$src/setup.py"
  # 5: newer g++ (13+): group_table.h uses std::string without including <string>.
  grep -q '#include <string>' "$src/horovod/common/group_table.h" \
    || sed -i 's/#include <mutex>/#include <mutex>\n#include <string>/' "$src/horovod/common/group_table.h"
  # and common.h throws std::logic_error without <stdexcept> (g++ from /opt/gcc with CUDA 13's
  # headers, measured on the lent H200 machine).
  grep -q '#include <stdexcept>' "$src/horovod/common/common.h" \
    || sed -i 's/#include <functional>/#include <functional>\n#include <stdexcept>/' "$src/horovod/common/common.h"
  # 6: CUDA 13's nvcc has no C++11 mode; the CUDA kernels are plain C++17 (as torch's are).
  sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
  # 7: g++ 14 (Debian 13) refuses the bundled flatbuffers' span::operator=, which assigns its
  #    const count_ (an error even uninstantiated); nothing uses it (it could never compile if
  #    called): drop it, as flatbuffers itself did.
  sed -i '/span &operator=(const span &other)/,/^  }/d' "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
  for f in "$src/horovod/torch/CMakeLists.txt" "$src/CMakeLists.txt"; do
    grep -q 'CMAKE_CXX_STANDARD 17' "$f" || die "C++17 patch did not apply to $f (sdist changed?)"
  done
  ! grep -q 'xla_mpi_ops.cc' "$src/horovod/tensorflow/CMakeLists.txt" || die "XLA patch did not apply"
  grep -q 'setup_requires=\[\]' "$src/setup.py" || die "setup_requires patch did not apply"
  grep -q '#include <string>' "$src/horovod/common/group_table.h" || die "<string> patch did not apply"
  grep -q '#include <stdexcept>' "$src/horovod/common/common.h" || die "<stdexcept> patch did not apply"
  grep -q 'CMAKE_CUDA_STANDARD 17' "$src/horovod/common/ops/cuda/CMakeLists.txt" || die "CUDA standard patch did not apply"
  ! grep -q 'span &operator=(const span &other)' "$src/third_party/flatbuffers/include/flatbuffers/stl_emulation.h" \
    || die "flatbuffers span patch did not apply"
}

case ${1:-} in
  --describe)   # the GPU part of the wheel's cache key
    gpu_describe
    exit 0 ;;
  --patch)      # --patch SDIST DIR: unpack and patch only (to read or test the patches)
    (($# == 3)) || die "usage: $0 --patch SDIST DIR"
    mkdir -p "$3"
    src=$(unpack "$2" "$3")
    patch_source "$src"
    say "patched $src"
    exit 0 ;;
esac
(($# == 2)) || die "usage: $0 SDIST WHEEL_DIR | $0 --describe | $0 --patch SDIST DIR"
mkdir -p "$2"
wheel_dir=$(readlink -f "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(unpack "$1" "$work")
patch_source "$src"

# ---------------------------------------------------------------- the build's environment
build_env=()
# CMake 4 refuses cmake_minimum_required(VERSION < 3.5), which gloo's CMakeLists.txt has.
cmake_major=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\).*/\1/p')
[[ -n $cmake_major ]] || die "no cmake on PATH"
((cmake_major >= 4)) && build_env+=(CMAKE_POLICY_VERSION_MINIMUM=3.5)
if [[ ${gpu_ops^^} == NCCL ]]; then
  gpu_describe >/dev/null
  # Linked shared, against the libnccl.so.2 torch also loads; CMake's find_library wants a
  # plain libnccl.so, which only NCCL's -dev package installs: a private link otherwise.
  nccl_lib=$(dirname "$NCCL_LIBFILE")
  if [[ ! -e $nccl_lib/libnccl.so ]]; then
    mkdir "$work/nccl-lib"
    ln -s "$NCCL_LIBFILE" "$work/nccl-lib/libnccl.so"
    nccl_lib=$work/nccl-lib
  fi
  build_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA" HOROVOD_NCCL_LINK=SHARED
              HOROVOD_NCCL_INCLUDE="$NCCL_INCLUDE" HOROVOD_NCCL_LIB="$nccl_lib"
              HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST")
  # NCCL from pip is not on the loader's path: the library records where it is.
  [[ $NCCL_FROM == pip* ]] && build_env+=(LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$(dirname "$NCCL_LIBFILE")")
fi
say "building $(basename "$src") with GPU operations ${gpu_ops}${build_env:+: ${build_env[*]}}"
(cd "$src" && env "${build_env[@]}" "$PY" -m pip wheel --disable-pip-version-check \
   --no-build-isolation --no-deps --no-index -w "$work/dist" .)
cp "$work"/dist/horovod-*.whl "$wheel_dir"/
say "built $(cd "$work/dist" && ls horovod-*.whl) into $wheel_dir"
