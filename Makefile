# The two entry points (see README.md). Both set up whatever is missing first; scripts/setup.sh
# is idempotent and reuses the cached Horovod wheel, so a second run is quick.
VENV ?= .venv
HPCSUITE = $(VENV)/bin/hpcsuite
PYTEST_ARGS ?=

.PHONY: setup setup-mpis setup-intelmpi demo test test-debian13 golden docs cluster-up cluster-down clean

setup:
	@bash scripts/setup.sh

# Start the local 2-node Slurm cluster and run the quickstart Horovod job on it.
demo: setup
	@$(HPCSUITE) cluster up
	@eval "$$($(HPCSUITE) cluster env)" && $(HPCSUITE) submit sbatch/quickstart.yaml --wait

# The other MPIs' venvs and Horovod builds that tests/test_e2e_mpis.py runs (scripts/setup.sh
# --mpi NAME; cached by key, so seconds once built).
setup-mpis: setup
	@bash scripts/setup.sh --mpi openmpi5
	@bash scripts/setup.sh --mpi mpich

# Intel MPI's runtime (PyPI's impi-rt, cached) that tests/test_e2e_mpi_lines.py runs.
setup-intelmpi:
	@bash scripts/intelmpi.sh

# The whole test suite, end-to-end tests on a private local Slurm cluster included; then the
# Debian 13 tier (test-debian13).
test: setup setup-mpis setup-intelmpi
	@$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-debian13

# The end-to-end core on Debian 13 (Slurm 24.11, Open MPI 5, Python 3.13) in a cached trixie root
# (docs/contributing/debian13.md); DEBIAN13_PYTEST_ARGS: what pytest runs there instead.
DEBIAN13_PYTEST_ARGS ?=
test-debian13: setup
	@bash scripts/debian13.sh $(DEBIAN13_PYTEST_ARGS)

# Re-render the example scripts in sbatch/ after a template change.
golden: setup
	@$(VENV)/bin/python scripts/regen_golden.py

# The docs site: regenerate docs/reference/ from the schema and the commands, then build
# site/ with --strict (a broken link or a page missing from the nav fails).
docs: setup
	@$(VENV)/bin/python scripts/gen_reference.py
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

cluster-up: setup
	@$(HPCSUITE) cluster up

cluster-down:
	@$(HPCSUITE) cluster down

clean:
	rm -rf $(VENV) build dist *.egg-info runs site
