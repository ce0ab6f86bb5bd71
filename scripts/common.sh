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
    SEEDED_FRESH=1
  fi
}

# A checkout's first set-up copies the venv the last one made for the same inputs: a fresh clone
# (CI's) otherwise spends minutes unpacking torch and TensorFlow and building mpi4py again. The
# copy is hard links (as uv's cache installs are), seconds for 3 GB; pip replaces a file rather
# than writing into it, so installing into one venv never changes another. Only what names the
# venv itself is rewritten: bin/'s scripts and pyvenv.cfg. hpcsuite (editable, pointing into
# the checkout that made it) is not in the seed; the set-up installs it as it would anyway.
#
# venv_seed NAME KEYPARTS...: before make_venv. Sets SEED to the seed's directory for NAME and
# these inputs, and seeds a missing $VENV from it when it exists (on the same file system);
# SEEDED=1 then. The key must name everything the venv's packages depend on.
# venv_seed_save: after the set-up passed; keeps $VENV as the seed if it was made from scratch.
# HPCSUITE_VENV_SEED=0 turns both off.
venv_seed() {
  local name=$1; shift
  SEED= SEEDED=0
  [[ ${HPCSUITE_VENV_SEED:-1} != 0 ]] || return 0
  local key
  key=$(printf '%s\n' "$@" "$("$PYTHON" -VV 2>&1)" | sha256sum | cut -c1-16)
  SEED=$CACHE/venv-seeds/$name-$key
  SEEDED_FRESH=0
  [[ ! -e $VENV && -f $SEED/.seed-of ]] || return 0
  local from
  from=$(cat "$SEED/.seed-of")
  mkdir -p "$(dirname "$VENV")"
  if ! cp -al "$SEED" "$VENV.partial" 2>/dev/null; then
    rm -rf "$VENV.partial"; return 0      # another file system: the set-up installs as usual
  fi
  rm -f "$VENV.partial/.seed-of"
  # The set-up's own stamps are written with `>`, into the file: each venv gets its own.
  local f
  for f in "$VENV.partial"/.[!.]*; do
    [[ -f $f ]] && cp "$f" "$f.own" && mv -f "$f.own" "$f"
  done
  # sed -i writes a new file: the seed's own copy keeps its paths.
  { grep -lIF -- "$from" "$VENV.partial"/bin/* "$VENV.partial/pyvenv.cfg" 2>/dev/null || true; } \
    | while read -r f; do sed -i "s|$from|$VENV|g" "$f"; done
  mv "$VENV.partial" "$VENV"
  SEEDED=1
  say "venv $VENV copied from the set-up cache ($SEED)"
}

venv_seed_save() {
  [[ -n ${SEED:-} && ${SEEDED_FRESH:-0} == 1 && ! -e $SEED ]] || return 0
  mkdir -p "$(dirname "$SEED")"
  rm -rf "$SEED.partial"
  cp -al "$VENV" "$SEED.partial" 2>/dev/null || { rm -rf "$SEED.partial"; return 0; }
  # Unlinks the seed's names only: $VENV keeps its hpcsuite.
  "$SEED.partial/bin/python" -m pip uninstall -q -y hpcsuite >/dev/null 2>&1 || true
  rm -f "$SEED.partial"/.hpcsuite-pyproject.sha
  echo "$VENV" > "$SEED.partial/.seed-of"
  mv "$SEED.partial" "$SEED"
  # Keep the two newest seeds of each kind; an older one is a venv no set-up would copy.
  local kind=${SEED##*/}; kind=${kind%-*}
  ls -dt "$(dirname "$SEED")/$kind"-* 2>/dev/null | tail -n +3 | xargs -r rm -rf
  say "kept $VENV as the set-up cache's venv for this key ($SEED)"
}
