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

# make test runs the suite in two parts at once and fails when either fails:
# - the tests that measure rates, losses or delays of real traffic in network namespaces
#   (marker timing), one at a time at nice -10 (as root; unchanged otherwise); they keep
#   about half a core busy, and nice -10 gives them what they want before anything else here,
#   as if the testbed's hosts were machines of their own;
# - the rest on two pytest-xdist workers, each taking whole units: tests/clients (its
#   deployment is made once), the other namespace tests as one (one of their testbeds at a
#   time), else a file (see tests/conftest.py). They use the cores the measuring tests leave,
#   at nice 0: niced, they would starve beside any other work on the machine and run into
#   their timeouts.
# Their outputs follow each other: the measuring tests' as they run, then the rest's.
SHELL := /bin/bash
TEST_WORKERS = 2
ALONE = timing
test: setup
	status=0; rest_log=$$(mktemp); \
	( trap - INT; exec $(PYTHON) -m pytest -q -m "not ($(ALONE))" -n $(TEST_WORKERS) \
	  --dist loadfile --no-loadscope-reorder ) >"$$rest_log" 2>&1 & rest=$$!; \
	( trap - INT; exec nice -n -10 $(PYTHON) -m pytest -q -m "$(ALONE)" ) & alone=$$!; \
	trap 'kill -INT $$alone $$rest 2>/dev/null' TERM; \
	wait $$alone || status=$$?; \
	wait $$rest || status=$$?; \
	wait; cat "$$rest_log"; rm -f "$$rest_log"; \
	exit $$status

bench: .venv-bench/.setup-stamp
	for b in benchmarks/*.py; do echo "== $$b"; $(BENCH_PYTHON) $$b || exit 1; done
