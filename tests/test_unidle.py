"""tests/unidle.py, which gives make test's rest normal scheduling once the measuring tests end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unidle import unidle, watch

# A child that starts a grandchild (both inherit the child's policy), says both pids, and
# waits for its standard input to close.
TREE = ("import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
        "stdin=subprocess.PIPE); print(g.pid, flush=True); sys.stdin.read(); g.stdin.close(); g.wait()")


def start_tree(policy: int, priority: int = 0) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.sched_setscheduler(0, policy, os.sched_param(priority)))
    return child, int(child.stdout.readline())


def test_an_idle_tree_goes_back_to_normal_scheduling():
    child, grandchild = start_tree(os.SCHED_IDLE)
    try:
        assert os.sched_getscheduler(grandchild) == os.SCHED_IDLE
        assert unidle(child.pid) >= 2  # at least the two main threads
        assert os.sched_getscheduler(child.pid) == os.sched_getscheduler(grandchild) == os.SCHED_OTHER
    finally:
        child.stdin.close()
        child.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="a real-time policy needs root")
def test_a_real_time_process_keeps_its_policy():
    child, grandchild = start_tree(os.SCHED_FIFO, 1)
    try:
        assert unidle(child.pid) == 0
        assert os.sched_getscheduler(grandchild) == os.SCHED_FIFO
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_starved_idle_tree_is_switched_and_a_finished_one_is_let_go():
    spin = [sys.executable, "-c", "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"]
    child, grandchild = start_tree(os.SCHED_IDLE)
    # Normal-priority busy loops on every core (30 s at most): the idle-class tree gets no CPU.
    spinners = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 1)]
    try:
        assert watch(child.pid, sample_s=0.5, samples=3)  # the busy loops are not `beside` it
        assert os.sched_getscheduler(grandchild) == os.SCHED_OTHER
    finally:
        for s in spinners:
            s.kill()
            s.wait()
        child.stdin.close()
        child.wait(timeout=30)
    assert not watch(child.pid, sample_s=0.1)  # its process is gone: nothing to watch
