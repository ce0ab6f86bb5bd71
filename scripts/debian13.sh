#!/usr/bin/env bash
# The Debian 13 (trixie) tier: the end-to-end core on Slurm 24.11, Open MPI 5, PMIx 5 and
# Python 3.13, in a root made from Debian 13's packages, on this (bookworm) machine.
#
#   scripts/debian13.sh [PYTEST ARGS]     (make test-debian13; default: tests/test_e2e_debian13.py)
#
# 1. A trixie root (mmdebstrap, Debian's packages only), cached under $CACHE/debian13/root-KEY,
#    KEY from the package list below: made once (~1.5 min), reused after.
# 2. Inside it a venv (/opt/venv) with tensorflow-cpu (PyPI has a 260 MB cp313 CPU wheel; its
#    torch for cp313 is a multi-GB CUDA build, so this tier runs the TensorFlow backend), mpi4py
#    built against trixie's Open MPI 5, and Horovod built TensorFlow-only against that Open MPI
#    (scripts/build_horovod.sh), its wheel cached in $CACHE/wheels by key like setup.sh's.
# 3. Every run: a copy of the working tree (git's tracked and untracked, not ignored, files) is
#    installed into the venv from its wheel, and pytest runs there under chroot, in a private
#    mount and PID namespace: /proc, /sys, /dev and /dev/shm are mounted for it and unmounted
#    when it ends, and every daemon it started (munged, slurmctld, slurmd, mariadbd, slurmdbd,
#    MPI's) dies with the namespace, whatever way the run ends.
#
# Environment: HPCSUITE_CACHE (default ~/.cache/hpcsuite), HPCSUITE_DEBIAN13_PORT (the local
# cluster's port inside, default 17170; the root shares this machine's network). Needs root.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${HPCSUITE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcsuite}
PORT=${HPCSUITE_DEBIAN13_PORT:-17170}

. "$REPO/scripts/common.sh"   # HOROVOD_VERSION, TORCH_VERSION, TF_VERSION, MPI4PY_VERSION, pip_q, have
# The root's recipe: changing it makes a new root (the key is its hash).
SUITE=trixie
PACKAGES=(slurmd slurmctld slurm-client slurmdbd mariadb-server munge openmpi-bin libopenmpi-dev
          libpmix-dev python3 python3-venv python3-dev cmake g++ make procps hostname iproute2
          ca-certificates)
VENV=/opt/venv          # inside the root
SRC=/src/hpcsuite       # the working tree's copy, inside the root

say() { printf '[debian13] %s\n' "$*" >&2; }
die() { printf '[debian13] error: %s\n' "$*" >&2; exit 1; }

root_key=$(printf '%s\n' "$SUITE" "${PACKAGES[@]}" | sha256sum | cut -c1-12)
ROOT=$CACHE/debian13/root-$root_key

# in_root CMD: run a bash command line inside the root, with a clean environment.
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} \
    ${no_proxy:+no_proxy=$no_proxy} \
    HPCSUITE_TEST_PORT="$PORT" HPCSUITE_TIER=debian13 bash -euo pipefail -c "$1"
}

# ------------------------------------------------------------------ inside the namespaces
if [[ ${1:-} == --in-namespace ]]; then
  shift
  mounted=()
  unmount_all() {   # innermost first; the namespace would drop them anyway, this says so
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  }
  trap unmount_all EXIT
  mnt() { mount "$@"; mounted+=("${!#}"); }
  mnt -t proc proc "$ROOT/proc"
  mnt --rbind /sys "$ROOT/sys"
  mnt --rbind /dev "$ROOT/dev"
  mnt -t tmpfs -o mode=1777,size=4g tmpfs "$ROOT/dev/shm"
  mkdir -p "$ROOT/cache"
  mnt --bind "$CACHE" "$ROOT/cache"
  # This machine's name service and the certificate authorities its network needs (pip's
  # downloads may pass a proxy whose CA only the machine's bundle holds).
  cp /etc/resolv.conf /etc/hosts "$ROOT/etc/"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
  find "$ROOT/tmp" -mindepth 1 -delete
  # slurmdbd 24.11.5 (trixie) cannot start with trixie's MariaDB Connector/C (libmariadb3
  # 11.8.9): its first query fails with "5027 Number of columns in result (=1) set execeeds
  # maxmimum allowed number of columns (=0)" and it dies in _check_mysql_concat_is_sane (the
  # mariadb client, same library, runs that query fine). Debian 12's connector (this
  # machine's, 10.11) works: slurmdbd alone is started with it, through a wrapper that
  # /usr/local/sbin puts first on PATH. Everything else is trixie's.
  host_connector=/usr/lib/x86_64-linux-gnu/libmariadb.so.3
  [[ -e $host_connector ]] || die "no $host_connector on this machine (apt-get install libmariadb3): slurmdbd needs it"
  mkdir -p "$ROOT/opt/bookworm-libmariadb"
  cp -L "$host_connector" "$ROOT/opt/bookworm-libmariadb/"
  printf '#!/bin/sh\n# scripts/debian13.sh: Debian 12'"'"'s MariaDB connector for slurmdbd (see there)\nLD_LIBRARY_PATH=/opt/bookworm-libmariadb exec /usr/sbin/slurmdbd "$@"\n' \
    > "$ROOT/usr/local/sbin/slurmdbd"
  chmod 755 "$ROOT/usr/local/sbin/slurmdbd"

  # -------------------------------------------------------------- the venv (once, by key)
  py_tag=$(in_root 'python3 -c "import sys; print(f\"cp{sys.version_info[0]}{sys.version_info[1]}\")"')
  mpi_version=$(in_root 'mpirun --version | head -n1 | awk "{print \$NF}"')
  hvd_key="horovod-${HOROVOD_VERSION}_tf-${TF_VERSION}_${py_tag}_openmpi-${mpi_version}_debian13"
  deps_sum=$(sha256sum "$REPO/pyproject.toml" | cut -c1-12)
  venv_key="$hvd_key mpi4py-$MPI4PY_VERSION pyproject-$deps_sum"
  if [[ $(cat "$ROOT$VENV/.hpcsuite-key" 2>/dev/null) != "$venv_key" ]]; then
    say "setting up $VENV in the root ($venv_key)"
    in_root "[[ -x $VENV/bin/python ]] || python3 -m venv $VENV
      pip() { python -m pip -q --disable-pip-version-check \"\$@\"; }
      pip install setuptools wheel tensorflow-cpu==$TF_VERSION
      python -c 'import mpi4py' 2>/dev/null || pip install --no-binary mpi4py mpi4py==$MPI4PY_VERSION"
    wheel_dir=$CACHE/wheels/$hvd_key
    if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
      [[ -f $CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz ]] \
        || die "no Horovod sdist in $CACHE/sdist: run scripts/setup.sh first"
      say "building Horovod $HOROVOD_VERSION for TensorFlow against Open MPI $mpi_version (~6 min on 2 cores)"
      mkdir -p "$ROOT/build" && cp -r "$REPO/scripts" "$ROOT/build/"
      in_root "cd /build && PY=$VENV/bin/python HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI \
        MAKEFLAGS=-j\$(nproc) bash scripts/build_horovod.sh /cache/sdist/horovod-$HOROVOD_VERSION.tar.gz dist" \
        > "$ROOT/build/build.log" 2>&1 || { tail -n 40 "$ROOT/build/build.log" >&2; die "Horovod build failed"; }
      mkdir -p "$wheel_dir" && cp "$ROOT"/build/dist/horovod-*.whl "$wheel_dir"/
      rm -rf "$ROOT/build"
      say "cached $(cd "$wheel_dir" && ls) in $wheel_dir"
    fi
    in_root "pip() { python -m pip -q --disable-pip-version-check \"\$@\"; }
      pip install --force-reinstall --no-deps /cache/wheels/$hvd_key/horovod-*.whl
      pip install cloudpickle psutil pyyaml packaging cffi
      check=\$(horovodrun --check-build 2>/dev/null) || true
      grep -q '\[X\] TensorFlow' <<<\"\$check\" && grep -q '\[X\] MPI' <<<\"\$check\" \
        || { echo \"this Horovod lacks TensorFlow or MPI: \$check\" >&2; exit 1; }"
    echo "$venv_key" > "$ROOT$VENV/.hpcsuite-key.deps"
  fi

  # -------------------------------------------------------------- this working tree, installed
  rm -rf "$ROOT$SRC" && mkdir -p "$ROOT$SRC"
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) \
    | tar -xf - -C "$ROOT$SRC"
  if [[ -f $ROOT$VENV/.hpcsuite-key.deps ]]; then   # first time: hpcsuite's own dependencies too
    in_root "cd $SRC && python -m pip -q --disable-pip-version-check install --no-build-isolation '.[train,study]' pytest pytest-timeout"
    mv "$ROOT$VENV/.hpcsuite-key.deps" "$ROOT$VENV/.hpcsuite-key"
  fi
  in_root "cd $SRC && python -m pip -q --disable-pip-version-check install --no-build-isolation --no-deps --force-reinstall ."
  in_root 'printf "%s; %s; Open MPI %s; %s\n" "$(. /etc/os-release; echo $PRETTY_NAME)" "$(slurmctld -V)" \
             "$(mpirun --version | head -n1 | awk "{print \$NF}")" "$(python --version)"' | sed 's/^/[debian13] /' >&2

  # -------------------------------------------------------------- the tests
  args=("$@")
  ((${#args[@]})) || args=(tests/test_e2e_debian13.py)
  in_root "cd $SRC && python -m pytest -p no:cacheprovider $(printf '%q ' "${args[@]}")"
  exit
fi

# ------------------------------------------------------------------ on the machine
[[ $(id -u) == 0 ]] || die "the Debian 13 tier needs root (mmdebstrap, chroot, mounts)"
start=$SECONDS
if [[ ! -x $ROOT/usr/sbin/slurmctld ]]; then
  command -v mmdebstrap >/dev/null || { say "installing mmdebstrap"; apt-get install -y -qq mmdebstrap >/dev/null; }
  say "making the Debian 13 root $ROOT (once)"
  mkdir -p "$CACHE/debian13"
  tmp=$CACHE/debian13/.making-$root_key
  rm -rf "$tmp"
  # Debian's packages must not start their services (the local cluster runs its own copies).
  mmdebstrap --variant=apt --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    --customize-hook='printf "#!/bin/sh\nexit 101\n" > "$1/usr/sbin/policy-rc.d"; chmod 755 "$1/usr/sbin/policy-rc.d"' \
    "$SUITE" "$tmp" > "$CACHE/debian13/mmdebstrap.log" 2>&1 \
    || { tail -n 20 "$CACHE/debian13/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $CACHE/debian13/mmdebstrap.log)"; }
  mv "$tmp" "$ROOT"
fi
rc=0
unshare --mount --pid --fork --kill-child --propagation private bash "$0" --in-namespace "$@" || rc=$?
# The namespace is gone: nothing of it may be left mounted or running.
if grep -q " $ROOT/" /proc/mounts; then say "still mounted under $ROOT:"; grep " $ROOT/" /proc/mounts >&2; rc=1; fi
for p in /proc/[0-9]*; do
  [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] && { say "still running in the root: $(tr '\0' ' ' < "$p/cmdline")"; rc=1; }
done
say "done in $((SECONDS - start)) s (exit $rc)"
exit "$rc"
