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

# make test runs the suite in two parts and fails when either fails:
# - the tests that measure rates, losses or delays of real traffic in network namespaces
#   (marker timing), one at a time; they keep about half a core busy;
# - the rest on two pytest-xdist workers, each taking whole units: tests/clients (its
#   deployment is made once), the other namespace tests as one (one of their testbeds at a
#   time), else a file (see tests/conftest.py).
# On an idle machine (under IDLE_BELOW % of the CPU busy over a second) the rest run beside
# the measuring tests under SCHED_IDLE (chrt -i 0), on the CPU those leave idle: any other
# task that wakes takes a core from them at once and is placed on a core that runs only them
# as on an idle one (nice 19 alone left a constant-rate flow short of its rate). When the
# measuring tests end, or as soon as other work on the machine starves them, the rest go
# back to normal scheduling (tests/unidle.py): idle-class beside other work they would fail
# on their timeouts (the measuring tests then share the CPU with both, and may fail: other
# work that starts during them is the case this does not protect). On a machine busy at the
# start the rest run afterwards. Beside the measuring tests, the rest's namespace tests wait
# for them to end (tests/conftest.py NETNS_AFTER): their namespaces, real-time emulators and
# traffic are kernel work that SCHED_IDLE does not hold back, and packets and rate went missing
# beside them. The measuring tests' output comes as they run, then the
# rest's. Fresh clones here, set-up included: 489-534 s quiet, 1116 s with both cores busy
# (the eye on every site the tests build, the README's commands and the fuzz profile added
# ~60-90 s to the rest).
SHELL := /bin/bash
TEST_WORKERS = 2
ALONE = timing
IDLE_BELOW = 20
BUSY_PERCENT = $(PYTHON) -c 'import time; r = lambda: [int(x) for x in open("/proc/stat").readline().split()[1:]]; \
	a = r(); time.sleep(1); d = [y - x for x, y in zip(a, r())]; print(round(100 - 100 * (d[3] + d[4]) / sum(d)))'
ALONE_RUN = $(PYTHON) -m pytest -q -m "$(ALONE)"
REST = $(PYTHON) -m pytest -q -m "not ($(ALONE))" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Bytecode written in the tests' runs, even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): pytest otherwise rewrites every test module's asserts again in
# each session and worker (~10 s of CPU each), and every site, Ray worker and command the
# tests start compiles the project's modules again. __pycache__ is ignored by git.
test: export PYTHONDONTWRITEBYTECODE =
test: setup
	status=0; rest_log=$$(mktemp); gate=$$(mktemp -u); busy=$$($(BUSY_PERCENT)); \
	if [ "$$busy" -lt $(IDLE_BELOW) ] && command -v chrt >/dev/null; then \
	  echo "make test: $$busy % of the CPU busy: the rest run beside the measuring tests (SCHED_IDLE)"; \
	  ( trap - INT; export PATHMASTER_TEST_NETNS_AFTER="$$gate"; exec chrt -i 0 $(REST) ) >"$$rest_log" 2>&1 & rest=$$!; \
	  ( trap - INT; exec $(ALONE_RUN) ) & alone=$$!; \
	  $(PYTHON) tests/unidle.py --watch $$rest --beside $$alone & watcher=$$!; \
	  trap 'kill -INT $$rest $$alone 2>/dev/null' TERM; \
	  wait $$alone || status=$$?; touch "$$gate"; \
	  kill $$watcher 2>/dev/null; $(PYTHON) tests/unidle.py $$rest; \
	  wait $$rest || status=$$?; cat "$$rest_log"; \
	else \
	  echo "make test: $$busy % of the CPU busy (or no chrt): the rest run after the measuring tests"; \
	  $(ALONE_RUN) || status=$$?; \
	  $(REST) || status=$$?; \
	fi; \
	rm -f "$$rest_log" "$$gate"; exit $$status

bench: .venv-bench/.setup-stamp
	for b in benchmarks/*.py; do echo "== $$b"; $(BENCH_PYTHON) $$b || exit 1; done
