#!/usr/bin/env bash
# The unprivileged test account `hpcuser`, and (with --venv) its own venv: the end-to-end tests
# of tests/test_e2e_nonroot.py submit jobs as it, as a site's users do. Idempotent; root only.
#
#   bash scripts/test_account.sh          make the account (no password, home /home/hpcuser)
#   bash scripts/test_account.sh --venv   also make its venv and print the venv's path
#
# The account cannot read root's Python (/root is mode 700), nor, at a site or in CI, the
# repository, so its venv is its own: made from Debian's /usr/bin/python3.11, with hpcsuite
# installed from a wheel built from this checkout (not editable), torch 2.13.0 (CPU) and the
# Horovod wheel scripts/setup.sh built and cached (for cp311 and the system Open MPI). The venv
# is kept (its key: Python, torch and the Horovod wheel) and only hpcsuite is reinstalled when
# its sources changed, so a second run takes a second or two. pip runs as root with root's
# pip configuration (this machine's local indexes) and the account is then given the venv.
#
# Environment knobs:
#   HPCSUITE_TEST_USER  the account's name (default: hpcuser)
#   HPCSUITE_CACHE      the wheel cache setup.sh uses (default: ~/.cache/hpcsuite)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
USER_NAME=${HPCSUITE_TEST_USER:-hpcuser}
CACHE=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}
PYTHON=/usr/bin/python3.11
. "$REPO/scripts/common.sh"   # HOROVOD_VERSION, TORCH_VERSION, TF_VERSION, MPI4PY_VERSION, pip_q, have

say() { printf '[test-account] %s\n' "$*" >&2; }
die() { printf '[test-account] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root: it makes the account $USER_NAME"

if ! id -u "$USER_NAME" >/dev/null 2>&1; then
  say "making the unprivileged account $USER_NAME"
  useradd --create-home --shell /bin/bash --user-group "$USER_NAME"
fi
[[ ${1:-} == --venv ]] || exit 0

home=$(getent passwd "$USER_NAME" | cut -d: -f6)
VENV=$home/venv-hpcsuite
[[ -x $PYTHON ]] || die "$PYTHON not found: the account's venv is made from Debian's python3.11"
# The wheel setup.sh built for the system Open MPI (other MPIs' wheels sit beside it, and
# link their own libmpi by RPATH): its directory's name ends with that version, no GPU suffix.
mpi_version=$(mpirun --version 2>/dev/null | head -n1 | awk '{print $NF}')
wheel=$(ls "$CACHE"/wheels/horovod-*_cp311_openmpi-"$mpi_version"/horovod-*.whl 2>/dev/null | head -n1) \
  || true
[[ -n $wheel ]] || die "no cached CPU Horovod wheel for cp311 and Open MPI $mpi_version in $CACHE/wheels: run scripts/setup.sh first"

pip_q() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" \
            2> >(grep -v '^WARNING: Location' >&2); }

key="python-$($PYTHON -c 'import platform; print(platform.python_version())')_torch-${TORCH_VERSION}_$(sha256sum "$wheel" | cut -c1-16)"
if [[ ! -f $VENV/.key || $(cat "$VENV/.key") != "$key" ]]; then
  say "making $VENV ($key)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pip_q "torch==$TORCH_VERSION"
  pip_q --no-deps "$wheel"
  # Horovod's runtime deps; mpi4py built against the system Open MPI, as setup.sh does.
  pip_q cloudpickle psutil pyyaml packaging cffi
  pip_q --no-binary mpi4py "mpi4py==$MPI4PY_VERSION"
  echo "$key" > "$VENV/.key"
fi

# hpcsuite from a wheel of this checkout, rebuilt when its sources changed.
sources=$(cd "$REPO" && git ls-files -co --exclude-standard pyproject.toml hpcsuite templates models sbatch \
            | grep -v '__pycache__' | sort | xargs sha256sum | sha256sum | cut -c1-16)
if [[ ! -f $VENV/.hpcsuite-sources || $(cat "$VENV/.hpcsuite-sources") != "$sources" ]]; then
  say "installing hpcsuite from a wheel of $REPO into $VENV"
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  # Built from a copy: a build in the checkout would leave build/ and *.egg-info behind.
  (cd "$REPO" && git ls-files -co --exclude-standard | grep -v '__pycache__' \
     | tar -cf - -T - 2>/dev/null) | tar -xf - -C "$build"
  "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$build/dist" "$build" \
    2> >(grep -v '^WARNING: Location' >&2)
  pip_q --force-reinstall --no-deps "$build"/dist/hpcsuite-*.whl
  # Its dependencies and the train and study extras (pip keeps what is already there).
  pip_q "$(ls "$build"/dist/hpcsuite-*.whl)[train,study]"
  echo "$sources" > "$VENV/.hpcsuite-sources"
fi
chown -R "$USER_NAME:$USER_NAME" "$VENV"
echo "$VENV"
