#!/usr/bin/env bash
# Lmod beside Environment Modules, for tests/test_packaging.py's load of hpcsuite's .lua module
# file: Debian's lmod package conflicts with environment-modules (installing one removes the
# other), so its .deb is unpacked into the cache and run from there with Debian's lua5.3,
# lua-posix, lua-filesystem, lua-json and lua-term (its dependencies, which conflict with
# nothing). Idempotent; scripts/setup.sh calls it.
#
#   bash scripts/setup_lmod.sh     ->  $HPCSUITE_CACHE/lmod/usr/share/lmod/lmod/libexec/lmod
set -euo pipefail
CACHE=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}
say() { printf '[setup lmod] %s\n' "$*" >&2; }
die() { printf '[setup lmod] error: %s\n' "$*" >&2; exit 1; }

missing=()
for p in lua5.3 lua-posix lua-filesystem lua-json lua-term; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ $(id -u) == 0 && ${HPCSUITE_SKIP_APT:-0} != 1 ]] || die "missing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
lmod=$CACHE/lmod/usr/share/lmod/lmod/libexec/lmod
if [[ ! -f $lmod ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download lmod >/dev/null 2>&1) || die "apt-get download lmod failed"
  rm -rf "$CACHE/lmod" && mkdir -p "$CACHE/lmod"
  dpkg-deb -x "$work"/lmod_*.deb "$CACHE/lmod"
  say "unpacked $(cd "$work" && ls lmod_*.deb) into $CACHE/lmod"
fi
lua5.3 "$lmod" --version >/dev/null 2>&1 || lua5.3 "$lmod" bash list >/dev/null || die "$lmod does not run"
