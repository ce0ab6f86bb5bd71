#!/usr/bin/env bash
# Everything hpcsuite checks on a lent GPU machine, in one command of under ~9.5 minutes, logged
# to $OUT: what the machine has (python, torch, CUDA, NCCL, GPUs); Horovod built with NCCL from
# the carried sdist by scripts/build_horovod.sh (setup.sh's build, offline; Gloo, torch only:
# the machine has no TensorFlow); hpcsuite on PYTHONPATH; Horovod's NCCL/CUDA build and a GPU
# allreduce; the GPU tests (tests/test_gpu.py: the backends on cuda, a rank trained with amp,
# the monitor and checkpoints, then resumed; tests/test_rank_outside_slurm.py: results written
# with no Slurm on PATH; tests/test_gpu_placement.py, tests/test_prefetch.py, tests/test_gpu_use.py); bench/gpu_pipeline.py where it exists;
# `hpcsuite doctor`'s Horovod line last. A failed step does not stop the next; the summary at
# the end (and $OUT/gpu_check_summary.txt) gives each step's exit status and seconds.
#
# The machine has no network: the Horovod sdist and the pure-Python wheels it may lack
# (cloudpickle, packaging, pytest, its plugins, pygments) travel in .gpu-carry/ (gitignored, ~5 MiB).
# On this machine, first:
#     bash bench/gpu_check.sh --prepare
# then the device call:
#     run(command="bash bench/gpu_check.sh", carry=[".gpu-carry"], timeout_s=590)
# (GPU_CHECK_BUDGET=560 s inside it: the pipeline benchmark (timeout 240) starts only with 245 s
# left, doctor only with 60; the build took ~115 s on that machine's 16 cores, the tests ~1.5 min).
# and the figures are in $OUT/gpu_check.log, gpu_check_summary.txt, horovod_build.log,
# pytest.log, pytest.xml and gpu_pipeline.json. The built wheel (~21 MB) is over $OUT's 16 MiB
# and stays there; its size and sha256 are logged. A rerun on the same warm machine reuses it
# (/tmp/hpcsuite-gpu-check).
#
#     bash bench/gpu_check.sh --quick  the build, horovod-nccl and bench/gpu_pipeline.py --rounds 8
#                                      only (no GPU tests, no doctor): ~200 s with the build
#     bash bench/gpu_check.sh --cpu   this script's logic on a machine without a GPU: no build
#                                      (the venv's Horovod), the GPU-only steps say why they fail
#                                      or skip; OUT defaults to /tmp/hpcsuite-gpu-check/out
#
# Environment: PY (python3), OUT, GPU_CHECK_DIR (/tmp/hpcsuite-gpu-check), GPU_CHECK_BUDGET
# (seconds for the whole script, 560), GPU_CHECK_HOROVOD_MPI=1 (build Horovod's MPI controller
# too; default Gloo only, the build known to work there).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
CARRY=$REPO/.gpu-carry
HOROVOD_VERSION=0.28.1
SDIST=$CARRY/horovod-$HOROVOD_VERSION.tar.gz
# Pure-Python wheels a bare GPU image may lack: Horovod's torch module imports cloudpickle and
# packaging; the tests need pytest (pytest-timeout for their limits).
CARRY_WHEELS=(cloudpickle packaging pytest pluggy iniconfig pygments pytest-timeout)

mode=gpu quick=0
for arg in "$@"; do
  case $arg in
    --prepare) mode=prepare ;;
    --cpu) mode=cpu ;;
    --quick) quick=1 ;;   # no GPU tests, no doctor; the pipeline benchmark with --rounds 8 (~200 s in all)
    *) echo "usage: $0 [--prepare | --cpu] [--quick]" >&2; exit 2 ;;
  esac
done

if [[ $mode == prepare ]]; then
  set -e
  mkdir -p "$CARRY/wheels"
  cache=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}/sdist/horovod-$HOROVOD_VERSION.tar.gz
  if [[ -f $cache ]]; then
    cp "$cache" "$SDIST"                    # scripts/setup.sh keeps it there
  elif [[ ! -f $SDIST ]]; then
    python3 -m pip download -q --no-binary :all: --no-deps -d "$CARRY" "horovod==$HOROVOD_VERSION"
  fi
  python3 -m pip download -q --only-binary :all: --no-deps -d "$CARRY/wheels" "${CARRY_WHEELS[@]}"
  ls -l "$CARRY" "$CARRY/wheels"
  du -sh "$CARRY"
  exit 0
fi

WORK=${GPU_CHECK_DIR:-/tmp/hpcsuite-gpu-check}
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT" "$WORK/wheels" "$WORK/py"
PY=${PY:-}
if [[ -z $PY ]]; then   # --cpu: the venv's Python and its Horovod, where there is one
  PY=python3
  [[ $mode == cpu && -x $REPO/.venv/bin/python ]] && PY=$REPO/.venv/bin/python
fi
BUDGET=${GPU_CHECK_BUDGET:-560}
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE=$!
echo "gpu_check: mode $mode, $(date -u +%FT%TZ), repo $REPO at $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)"

NAMES=() CODES=() TIMES=()
step() {   # step NAME COMMAND...: run it, note its exit status and seconds, go on whatever it did
  local name=$1 t0=$SECONDS rc
  shift
  echo "=== step $name ($((SECONDS))s into the check)"
  "$@"
  rc=$?
  NAMES+=("$name") CODES+=("$rc") TIMES+=("$((SECONDS - t0))")
  echo "=== step $name: exit $rc in $((SECONDS - t0))s"
  return 0
}
skip() { NAMES+=("$1") CODES+=("skip: $2") TIMES+=(0); echo "=== step $1 skipped: $2"; }

set -x

detect() {
  "$PY" --version
  "$PY" -c 'import sys; print(sys.executable)'
  "$PY" -c '
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(" ", i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
print("arch list", torch.cuda.get_arch_list())
print("torch nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv || true
  command -v nvcc cmake g++ gcc mpirun || true
  nvcc --version | tail -n 2 || /usr/local/cuda/bin/nvcc --version | tail -n 2 || true
  cmake --version | head -n 1; g++ --version | head -n 1
  ls -l /usr/include/nccl.h /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null || true
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(setuptools|wheel|pip|cffi|cloudpickle|packaging|pytest|psutil|pyyaml|mpi4py|nvidia-nccl|numpy|horovod) ' || true
  nproc; free -g | head -n 2
  "$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA GPU"'
}
step detect detect

carried_deps() {   # the carried wheels of what this Python lacks, into $WORK/py
  local -A module=([cloudpickle]=cloudpickle [packaging]=packaging [pytest]=pytest [pluggy]=pluggy
                   [iniconfig]=iniconfig [pygments]=pygments [pytest-timeout]=pytest_timeout)
  local name wheels=()
  for name in "${CARRY_WHEELS[@]}"; do
    "$PY" -c "import ${module[$name]}" 2>/dev/null && continue
    wheels+=("$CARRY"/wheels/"${name//-/_}"-*.whl)
  done
  ((${#wheels[@]})) || { echo "nothing to add"; return 0; }
  "$PY" -m pip install --no-index --no-deps --upgrade --target "$WORK/py" "${wheels[@]}"
}
export PYTHONPATH="$WORK/py:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$WORK/py/bin:$PATH"
step carried-deps carried_deps
# That machine's g++ is /opt/gcc's: on PATH there, or put there here.
if ! command -v g++ >/dev/null 2>&1 && [[ -x /opt/gcc/bin/g++ ]]; then
  export PATH="/opt/gcc/bin:$PATH"
fi

build() {
  if ls "$WORK"/wheels/horovod-*.whl >/dev/null 2>&1; then
    echo "reusing $(ls "$WORK"/wheels/horovod-*.whl) (delete $WORK/wheels to rebuild)"
    return 0
  fi
  [[ -f $SDIST ]] || { echo "no $SDIST: run bash bench/gpu_check.sh --prepare here and carry .gpu-carry"; return 1; }
  local mpi=(HOROVOD_WITHOUT_MPI=1)
  [[ ${GPU_CHECK_HOROVOD_MPI:-0} == 1 ]] && mpi=(HOROVOD_WITH_MPI=1)
  env PY="$PY" HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
      HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 "${mpi[@]}" MAKEFLAGS=-j"$(nproc)" \
      timeout 420 bash scripts/build_horovod.sh "$SDIST" "$WORK/wheels" > "$OUT/horovod_build.log" 2>&1
  local rc=$?
  grep -E '^\[build_horovod\]' "$OUT/horovod_build.log"
  ((rc == 0)) || tail -n 60 "$OUT/horovod_build.log"
  return $rc
}
install_horovod() {
  "$PY" -m pip install --no-index --no-deps --upgrade --target "$WORK/py" "$WORK"/wheels/horovod-*.whl || return 1
  ls -l "$WORK"/wheels/horovod-*.whl; sha256sum "$WORK"/wheels/horovod-*.whl
  # what the torch extension loads: NCCL (shared), the CUDA runtime, a libstdc++ new enough
  ldd "$WORK"/py/horovod/torch/mpi_lib_v2*.so | grep -E 'nccl|cuda|stdc\+\+|not found'
  local w size
  for w in "$WORK"/wheels/horovod-*.whl; do           # $OUT takes files under 16 MiB
    size=$(stat -c %s "$w")
    ((size < 16 * 1024 * 1024)) && cp "$w" "$OUT"/ || echo "$(basename "$w"): $size bytes, not copied to \$OUT"
  done
  return 0
}
if [[ $mode == gpu ]]; then
  step horovod-build build
  step horovod-install install_horovod
else   # --cpu: the venv's Horovod; NCCL/CUDA discovery exercised, expected to fail without them
  step horovod-build-describe env PY="$PY" bash scripts/build_horovod.sh --describe
fi

# PYTHONPATH has the repository whatever this says (an externally managed Python refuses it).
if [[ $mode == gpu ]]; then
  step hpcsuite-install "$PY" -m pip install --no-index --no-deps --no-build-isolation -e "$REPO"
fi

step horovod-nccl "$PY" -c '
import horovod.torch as hvd, torch
hvd.init()
print("nccl_built", hvd.nccl_built(), "cuda_built", hvd.cuda_built(), "size", hvd.size())
t = torch.ones(1 << 20, device="cuda")
print("allreduce on", hvd.allreduce(t, op=hvd.Sum).device, "ok")
assert hvd.nccl_built() and hvd.cuda_built()'

tests() {
  timeout 240 "$PY" -m pytest tests/test_gpu.py tests/test_rank_outside_slurm.py \
    tests/test_gpu_placement.py tests/test_prefetch.py tests/test_gpu_use.py -q -rs -p no:cacheprovider --junitxml="$OUT/pytest.xml" \
    2>&1 | tee "$OUT/pytest.log" | tail -n 40
}
if ((quick)); then
  skip gpu-tests "--quick"
else
  step gpu-tests tests
fi
ROUNDS=()
((quick)) && ROUNDS=(--rounds "${GPU_CHECK_ROUNDS:-8}")
# GPU_CHECK_MODELS=mlp: only those models (a last call with little device time left)
[[ -n ${GPU_CHECK_MODELS:-} ]] && ROUNDS+=(--models "$GPU_CHECK_MODELS")

if [[ ! -f bench/gpu_pipeline.py ]]; then
  skip gpu-pipeline "bench/gpu_pipeline.py is not in this checkout"
elif ((BUDGET - SECONDS < 245)); then
  skip gpu-pipeline "$((BUDGET - SECONDS))s left of GPU_CHECK_BUDGET=$BUDGET, under the 245 it needs"
elif [[ $mode == cpu ]]; then   # its logic only, as its header says
  step gpu-pipeline timeout 240 "$PY" bench/gpu_pipeline.py --device cpu --steps 5 --rounds 2 \
    --batch 32 --samples 1024 --out "$OUT/gpu_pipeline.json"
else
  step gpu-pipeline timeout 240 "$PY" bench/gpu_pipeline.py "${ROUNDS[@]}" --out "$OUT/gpu_pipeline.json"
fi

doctor_line() {
  "$PY" -m hpcsuite doctor --no-compute --json > "$OUT/doctor.json"   # no Slurm here: exit 1
  "$PY" -c 'import json, sys
checks = {c["name"]: c for c in json.load(open(sys.argv[1]))}
for name in ("horovod", "gpus"):
    print(name, checks[name]["status"], checks[name]["detail"])
assert "GPU build: CUDA, NCCL" in checks["horovod"]["detail"]' "$OUT/doctor.json"
}
if ((quick)); then
  skip doctor "--quick"
elif ((BUDGET - SECONDS < 60)); then
  skip doctor "$((BUDGET - SECONDS))s left of GPU_CHECK_BUDGET=$BUDGET, under the 60 it needs"
else
  step doctor doctor_line
fi

set +x
{
  echo "gpu_check summary (mode $mode, ${SECONDS}s, $(date -u +%FT%TZ)):"
  for i in "${!NAMES[@]}"; do
    printf '  %-22s %-10s %4ss\n' "${NAMES[$i]}" "$([[ ${CODES[$i]} == 0 ]] && echo ok || echo "${CODES[$i]}")" "${TIMES[$i]}"
  done
} | tee "$OUT/gpu_check_summary.txt"
exec >&- 2>&-
wait "$TEE"      # the log is whole before the machine is handed back
