# The two entry points (see README.md). Both set up whatever is missing first; scripts/setup.sh
# is idempotent and reuses the cached Horovod wheel, so a second run is quick.
VENV ?= .venv
HPCSUITE = $(VENV)/bin/hpcsuite
PYTEST_ARGS ?=

.PHONY: setup setup-mpis setup-intelmpi setup-account demo test test-fast test-full test-debian13 golden docs cluster-up cluster-down clean

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

# The README's test command and CI's (.ci/run): the unit tests, then every end-to-end test but
# the repeats along one axis that tests/tiers.py keeps for test-full, then the Debian 13 tier;
# in stages with time bounds (scripts/test_tier.sh, docs/contributing/test-tiers.md).
test: setup setup-mpis setup-intelmpi setup-account
	@PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_tier.sh ci

# For working on the code: the unit tests and one end-to-end job per main user path (~10 min).
test-fast: setup
	@PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_tier.sh fast

# Everything: CI's tier and the repeats (other launcher, backend, MPI), 1000 fuzz cases per kind.
test-full: setup setup-mpis setup-intelmpi setup-account
	@PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_tier.sh full

# The unprivileged test account and its install (tests/test_e2e_install.py, test_e2e_nonroot.py):
# its venv, the site-style MPI module and its Horovod build, cached by key in its home, so the
# minutes a new key costs are spent here, before the tests, and seconds every other time.
setup-account: setup
	@if [ "$$(id -u)" = 0 ]; then \
	  bash scripts/test_account.sh --venv >/dev/null && $(VENV)/bin/python tests/test_e2e_install.py; \
	else echo "setup-account: not root; the tests that run as the account skip"; fi

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
