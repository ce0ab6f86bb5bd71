#!/usr/bin/env bash
# Set up everything hpcsuite needs on a Debian bookworm machine, idempotently:
#   Debian packages (OpenMPI, Slurm, munge, build tools, Chromium), a venv with torch, TensorFlow,
#   mpi4py and hpcsuite, and Horovod 0.28.1 built from its PyPI sdist with the patches
#   today's frameworks need (scripts/build_horovod.sh). The sdist and the built Horovod wheel
#   are cached, the wheel keyed by the versions it was built against (CUDA, NCCL and compute
#   capabilities too, for a GPU build), so a second run installs it in seconds and never rebuilds.
#
# Environment knobs:
#   HPCSUITE_VENV   venv directory              (default: <repo>/.venv)
#   HPCSUITE_CACHE  wheel cache directory       (default: ~/.cache/hpcsuite)
#   HPCSUITE_SKIP_APT=1  do not call apt-get (packages must already be there)
#   HOROVOD_GPU_OPERATIONS=NCCL|none  build Horovod's GPU operations or not (default: NCCL where
#                        nvcc exists and torch has CUDA); HOROVOD_NCCL_HOME, HOROVOD_CUDA_HOME,
#                        HOROVOD_BUILD_CUDA_CC_LIST: see scripts/build_horovod.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# scripts/setup.sh --mpi openmpi5|mpich: a venv and Horovod for another MPI (scripts/setup_mpi.sh).
if [[ ${1:-} == --mpi ]]; then exec bash "$REPO/scripts/setup_mpi.sh" "${2:-}"; fi
VENV=${HPCSUITE_VENV:-$REPO/.venv}
CACHE=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}
PYTHON=${PYTHON:-python3}

. "$REPO/scripts/common.sh"   # HOROVOD_VERSION, TORCH_VERSION, TF_VERSION, MPI4PY_VERSION, pip_q, have

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- Debian packages
# charliecloud-runtime: ch-run, the container runtime the container e2e test runs ranks in.
# chromium: the headless browser tests/test_docs.py opens the built docs site in.
# openssh-server, openssh-client: the SSH hosts tests/test_e2e_remote.py reaches (via tests/sshd.py).
APT_PACKAGES=(openmpi-bin libopenmpi-dev slurm-wlm slurmdbd mariadb-server munge cmake build-essential
              environment-modules charliecloud-runtime chromium openssh-server openssh-client)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ ${HPCSUITE_SKIP_APT:-0} == 1 ]] && die "missing Debian packages: ${missing[*]} (HPCSUITE_SKIP_APT=1 is set)"
  [[ $(id -u) == 0 ]] || die "missing Debian packages ${missing[*]}; run as root or install them first"
  say "installing Debian packages: ${missing[*]}"
  # The packages' own services (the system MariaDB, slurmdbd, munge) must not start: the local
  # cluster runs its own copies under its directory. policy-rc.d tells invoke-rc.d so.
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi

# Lmod unpacked beside Environment Modules (its package would remove them): scripts/setup_lmod.sh.
bash "$REPO/scripts/setup_lmod.sh"

# The unprivileged account the end-to-end tests submit as (tests/test_e2e_nonroot.py).
[[ $(id -u) != 0 ]] || bash "$REPO/scripts/test_account.sh"

# ---------------------------------------------------------------- venv + Python packages
# A new venv starts as a copy of the last one set up from the same inputs (common.sh, venv_seed).
venv_seed main "$(cat "$REPO/pyproject.toml" "$REPO/scripts/common.sh" "$REPO/scripts/setup.sh" | sha256sum)" \
  "$(mpirun --version 2>&1 | head -n1)" "${HOROVOD_GPU_OPERATIONS:-}" "$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)"
make_venv
PY=$VENV/bin/python

have torch "$TORCH_VERSION" || { say "installing torch==$TORCH_VERSION (CPU)"; pip_q "torch==$TORCH_VERSION"; }
have tensorflow-cpu "$TF_VERSION" || { say "installing tensorflow-cpu==$TF_VERSION"; pip_q "tensorflow-cpu==$TF_VERSION"; }
# Build mpi4py from source so it links the system OpenMPI that mpirun and Horovod use.
have mpi4py "$MPI4PY_VERSION" || { say "building mpi4py==$MPI4PY_VERSION against system OpenMPI"; pip_q --no-binary mpi4py "mpi4py==$MPI4PY_VERSION"; }

# hpcsuite itself (editable, with test extras); reinstall only when pyproject.toml changed.
# The test extra holds the tracking extra's mlflow (the full package, pinned: `mlflow ui`,
# `mlflow server` and the sqlite: store that `hpcsuite tracking sync` writes).
stamp=$VENV/.hpcsuite-pyproject.sha
sum=$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]] || ! "$PY" -c 'import hpcsuite' 2>/dev/null; then
  say "installing hpcsuite (editable) with test extras"
  # A seeded venv has every dependency of this pyproject.toml (its key): hpcsuite alone.
  if ((SEEDED)); then pip_q --no-deps -e "$REPO"; else pip_q -e "$REPO[test]"; fi
  echo "$sum" > "$stamp"
fi
# Byte-compile hpcsuite as a wheel install would: an editable install under
# PYTHONDONTWRITEBYTECODE=1 otherwise recompiles every module on every login-node command.
# Only changed files are recompiled, so this is quick when nothing changed.
"$PY" -m compileall -q "$REPO/hpcsuite" "$REPO/models" "$REPO/templates" "$REPO/sbatch" >/dev/null

# ---------------------------------------------------------------- Horovod
mpi_version=$(mpirun --version 2>/dev/null | head -n1 | awk '{print $NF}')
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# GPU nodes: with CUDA present (nvcc on PATH or in /usr/local/cuda, and torch.cuda built in)
# Horovod's GPU allreduce goes through NCCL; HOROVOD_GPU_OPERATIONS=none forces a CPU build.
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
if [[ -z $gpu_ops ]]; then
  gpu_ops=none
  if { command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; } &&
     "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    gpu_ops=NCCL
  fi
fi
key="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_tf-${TF_VERSION}_${py_tag}_openmpi-${mpi_version}"
gpu_env=()
if [[ $gpu_ops != none ]]; then
  # A GPU wheel is built for one CUDA, one NCCL and the compute capabilities of this node's GPUs
  # (scripts/build_horovod.sh finds them): each is part of its key.
  gpu_key=$(PY=$PY bash "$REPO/scripts/build_horovod.sh" --describe) \
    || die "cannot build Horovod with HOROVOD_GPU_OPERATIONS=$gpu_ops here (above); HOROVOD_GPU_OPERATIONS=none builds it for the CPU"
  key="${key}_gpu-${gpu_ops,,}_${gpu_key}"
  gpu_env=(HOROVOD_GPU_OPERATIONS="$gpu_ops")
fi
wheel_dir=$CACHE/wheels/$key

# .horovod-key is written only after `horovodrun --check-build` passed for this exact key.
if have horovod "$HOROVOD_VERSION" && [[ -f $VENV/.horovod-key && $(cat "$VENV/.horovod-key") == "$key" ]]; then
  say "ready: venv $VENV, Horovod $HOROVOD_VERSION ($key)"
  exit 0
fi
rm -f "$VENV/.horovod-key"

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
  say "building Horovod $HOROVOD_VERSION (key $key); this takes ~10 minutes on 2 cores"
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  # The sdist is cached too: bench/gpu_check.sh carries it to a GPU machine with no network.
  sdist=$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz
  if [[ ! -f $sdist ]]; then
    "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
      -d "$build" "horovod==$HOROVOD_VERSION" 2> >(grep -v '^WARNING: Location' >&2)
    mkdir -p "$CACHE/sdist"
    mv "$build/horovod-$HOROVOD_VERSION.tar.gz" "$sdist"
  fi
  # scripts/build_horovod.sh patches the sdist for today's torch, TensorFlow, g++, CMake and
  # CUDA, and finds CUDA and NCCL for a GPU build. cmake and the compilers come from Debian;
  # build against the venv's torch and TF.
  (PATH=$VENV/bin:$PATH PY=$PY \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j"$(nproc)" \
    env "${gpu_env[@]}" bash "$REPO/scripts/build_horovod.sh" "$sdist" "$build/dist" ) > "$build/build.log" 2>&1 \
    || { tail -n 40 "$build/build.log" >&2; die "Horovod build failed (log above)"; }
  mkdir -p "$wheel_dir"
  cp "$build"/dist/horovod-*.whl "$wheel_dir"/
  say "cached $(cd "$wheel_dir" && ls) in $wheel_dir"
fi
say "installing cached Horovod wheel from $wheel_dir"
pip_q --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
# Horovod's runtime deps, without letting pip touch torch or TensorFlow.
pip_q cloudpickle psutil pyyaml packaging cffi

# Stop here, loudly, if this Horovod cannot do what hpcsuite needs.
check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null) || die "horovodrun --check-build failed"
needs=(TensorFlow PyTorch MPI)
[[ $gpu_ops == none ]] || needs+=(NCCL)
for need in "${needs[@]}"; do
  grep -Eq "\[X\] $need" <<<"$check" || die "installed Horovod lacks $need support:
$check
delete $wheel_dir and rerun scripts/setup.sh to rebuild it"
done
echo "$key" > "$VENV/.horovod-key"
with="TensorFlow, PyTorch and MPI"
[[ $gpu_ops == none ]] || with="TensorFlow, PyTorch, MPI and NCCL"
say "ready: venv $VENV, Horovod $HOROVOD_VERSION with $with ($key)"
venv_seed_save
