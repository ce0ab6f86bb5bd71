# The two entry points (see README.md). Both set up whatever is missing first; scripts/setup.sh
# is idempotent and reuses the cached Horovod wheel, so a second run is quick.
VENV ?= .venv
HPCSUITE = $(VENV)/bin/hpcsuite
PYTEST_ARGS ?=

.PHONY: setup demo test golden docs cluster-up cluster-down clean

setup:
	@bash scripts/setup.sh

# Start the local 2-node Slurm cluster and run the quickstart Horovod job on it.
demo: setup
	@$(HPCSUITE) cluster up
	@eval "$$($(HPCSUITE) cluster env)" && $(HPCSUITE) submit sbatch/quickstart.yaml --wait

# The whole test suite, end-to-end tests on a private local Slurm cluster included.
test: setup
	@$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

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
