# Two entry points, both doing their own set-up on a fresh machine:
#   make demo   -> the main job (3 sites + coordinator on loopback, one 6-cell case)
#   make test   -> the test suite (what .ci/run calls)
# Set-up (deploy/setup.sh) makes the project's virtual environment .venv from uv.lock; every
# target runs the project from it. It re-runs when the dependencies, the lock or the script
# change, or when .venv is gone.
PYTHON = .venv/bin/python
STAMP := .venv/.setup-stamp

.PHONY: setup demo test bench
setup: $(STAMP)
$(STAMP): pyproject.toml uv.lock deploy/setup.sh
	bash deploy/setup.sh
	touch $@

demo: setup
	$(PYTHON) -m pathmaster demo

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done
