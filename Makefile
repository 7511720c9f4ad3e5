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

# make test runs the suite in two phases and fails when either fails. First, alone on the
# machine and one at a time, the tests that measure rates, losses or delays of real traffic
# in network namespaces (marker timing), which other tests' CPU work would disturb. Then the
# rest on two pytest-xdist workers, each taking whole files: tests/clients whole (its
# deployment is made once) and the other namespace tests (the product across the testbed,
# DSCP on the wire, ingest on two Ray nodes: no clock in their assertions) as one unit, one
# testbed at a time (see tests/conftest.py). On this 2-core machine, fresh clones, set-up
# included: two phases 9.5-10.8 min quiet (phase 1: 3.2-3.5 min, phase 2: 5.8-6.8 min),
# 17.4 min with both cores kept busy.
TEST_WORKERS = 2
ALONE = timing
# Bytecode written in the tests' runs, even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): pytest otherwise rewrites every test module's asserts again in
# each session and worker (~10 s of CPU each), and every site, Ray worker and command the
# tests start compiles the project's modules again. __pycache__ is ignored by git.
test: export PYTHONDONTWRITEBYTECODE =
test: setup
	status=0; \
	$(PYTHON) -m pytest -q -m "$(ALONE)" || status=$$?; \
	$(PYTHON) -m pytest -q -m "not ($(ALONE))" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder || status=$$?; \
	exit $$status

bench: .venv-bench/.setup-stamp
	for b in benchmarks/*.py; do echo "== $$b"; $(BENCH_PYTHON) $$b || exit 1; done
