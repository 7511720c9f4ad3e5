# Two entry points, both doing their own set-up on a fresh machine:
#   make demo   -> the main job (3 sites + coordinator on loopback, one 6-cell case)
#   make test   -> the test suite (what .ci/run calls)
PYTHON ?= python3

.PHONY: setup demo test bench
setup: .setup-stamp
.setup-stamp: pyproject.toml deploy/setup.sh
	bash deploy/setup.sh
	touch $@

demo: setup
	$(PYTHON) -m pathmaster demo

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done
