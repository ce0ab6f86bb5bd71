#!/bin/bash
# Intel MPI's runtime from PyPI (impi-rt: mpiexec.hydra, libmpi.so.12), for the end-to-end test
# of mpi.flavour intelmpi (tests/test_e2e_mpi_lines.py). No Horovod is built against it: the test
# runs a script whose ranks allreduce through Intel MPI itself under Hydra's mpiexec on Slurm.
# Kept in ~/.cache/hpcsuite/impi-rt (~330 MB), made once; HPCSUITE_IMPI_DIR points elsewhere.
set -euo pipefail
VERSION=2021.19.0
dest=${HPCSUITE_IMPI_DIR:-$HOME/.cache/hpcsuite/impi-rt}
if [ -x "$dest/bin/mpiexec.hydra" ] && [ "$(cat "$dest/.impi-version" 2>/dev/null)" = "$VERSION" ]; then
  echo "intelmpi: $dest has impi-rt $VERSION"
  exit 0
fi
rm -rf "$dest"
python3 -m venv "$dest"
# --no-deps: its libfabric requirement has no wheel here; the runtime loads the system's
# libfabric.so.1 instead (Debian's libfabric1, which Debian's Open MPI depends on)
"$dest/bin/pip" install --quiet --disable-pip-version-check --no-deps "impi-rt==$VERSION"
echo "$VERSION" > "$dest/.impi-version"
echo "intelmpi: impi-rt $VERSION in $dest"
