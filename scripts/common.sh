# Sourced by the set-up scripts (setup.sh, setup_mpi.sh, test_account.sh, debian13.sh): the
# versions every venv hpcsuite makes is pinned to, in one place, and the two pip helpers they
# share. A cached wheel's key names these versions, so changing one here rebuilds what it keys.
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
TF_VERSION=2.21.0
MPI4PY_VERSION=4.1.2

# pip install into $PY's environment, quietly. pip's config on these machines names local index
# folders that may be absent; its "Location ... is ignored" warnings are noise, the rest is shown.
pip_q() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2); }

# have NAME VERSION: is that release (local version label aside) installed in $PY's environment?
have() { "$PY" - "$@" <<'PYEOF'
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    got = version(sys.argv[1])
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if got.split("+")[0] == sys.argv[2] else 1)
PYEOF
}

# The venv $VENV, made from $PYTHON (which must be 3.11: torch's CPU wheel on this machine's disk
# and the cached Horovod wheels are cp311) when it is missing. Uses the caller's say and die.
make_venv() {
  "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null \
    || die "$PYTHON is not Python 3.11 (set PYTHON=...)"
  if [[ ! -x $VENV/bin/python ]]; then
    say "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
}
