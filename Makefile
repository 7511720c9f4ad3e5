# Two entry points, both doing their own set-up on a fresh machine:
#   make demo   -> the main job (3 sites + coordinator on loopback, one 6-cell case)
#   make test   -> the test suite (what .ci/run calls)
# Set-up (deploy/setup.sh) makes the project's virtual environment .venv from uv.lock (extra
# `test`: every role's libraries); demo and test run the project from it. make bench uses
# .venv-bench (extra `bench`, locked apart: see pyproject.toml). Set-up re-runs when the
# dependencies, the lock or the script change, or when the environment is gone.
PYTHON = .venv/bin/python
BENCH_PYTHON = .venv-bench/bin/python

.PHONY: setup demo test bench
setup: .venv/.setup-stamp
.venv/.setup-stamp: pyproject.toml uv.lock deploy/setup.sh
	bash deploy/setup.sh
	touch $@

.venv-bench/.setup-stamp: pyproject.toml uv.lock deploy/setup.sh
	PATHMASTER_VENV=.venv-bench bash deploy/setup.sh bench
	touch $@

demo: setup
	$(PYTHON) -m pathmaster demo

test: setup
	$(PYTHON) -m pytest -q

bench: .venv-bench/.setup-stamp
	for b in benchmarks/*.py; do echo "== $$b"; $(BENCH_PYTHON) $$b || exit 1; done
