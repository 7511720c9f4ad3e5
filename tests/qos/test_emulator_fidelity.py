"""A deliberately starved emulator is marked: real packets through a real emulator in a small
testbed (subnet A, its router and core), the emulator process stopped (SIGSTOP) for 60 ms of
every 100 ms while datagrams cross rA's emulated uplink. Its lateness, read from the snapshots as
the experiment runner reads them, must break the fidelity bound and make the run invalid."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from qos import netns
from qos.emulator.runner import nfqueue_unavailable_reason
from qos.experiment import fidelity
from qos.testbed import Testbed
from qos.testbed.config import from_dict

pytestmark = [pytest.mark.netns, pytest.mark.timing]

STOP_S, PERIOD_S = 0.060, 0.100  # the emulator gets 40 % of the wall clock, in slices
PINGS = 60  # datagrams, 20 ms apart, across rA's uplink to core (no ping binary needed)
SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[2])):
    s.sendto(bytes(1200), (sys.argv[1], 9))
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def testbed(netns_ok):
    reason = nfqueue_unavailable_reason()
    if reason:
        pytest.skip(reason)
    config = from_dict({"tag": netns.new_tag("pt"), "subnets": ["A"], "bottleneck": {"rate_kbit": 10_000}})
    with Testbed(config) as tb:
        # 20 ms in the delay line: most packets are inside the link whenever the process stops
        tb.set_strategy({"strategy": "fifo", "delay_ms": 20}, subnets=["A"], backend="emulator")
        yield tb


def _window(tb: Testbed, starve: bool) -> dict:
    """Datagrams across rA's emulated uplink; the fidelity record of that window (starved or not)."""
    target = tb.topology.uplinks["A"].intf2.ip
    before, machine0 = tb.emulator_snapshots(), fidelity.machine_sample()
    done = threading.Event()

    def starver() -> None:
        pid = tb.emulators["A"].pid
        for _ in range(200):  # bounded: at most 20 s
            if done.is_set():
                return
            os.kill(pid, signal.SIGSTOP)
            try:
                done.wait(STOP_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            done.wait(PERIOD_S - STOP_S)

    thread = threading.Thread(target=starver, daemon=True) if starve else None
    if thread:
        thread.start()
    try:
        tb.master.run(sys.executable, "-c", SEND, target, str(PINGS), timeout=60)
    finally:
        done.set()
        if thread:
            thread.join(timeout=5)
    after = tb.emulator_snapshots(newer_than=time.time(), timeout=5.0)
    return fidelity.fidelity_record(machine0, fidelity.machine_sample(), before, after)


def test_a_starved_emulator_is_marked_invalid_and_a_fed_one_is_recorded(testbed):
    fed = _window(testbed, starve=False)
    starved = _window(testbed, starve=True)
    for record in (fed, starved):
        late = record["emulator"]["lateness_s"]
        assert late["packets"] >= PINGS  # the datagrams crossed the emulated link
        assert record["machine"]["cpu_busy"] is not None and record["bound"]["p99_lateness_s"] > 0
    assert not starved["valid"] and "lateness_p99" in starved["invalid_reasons"]
    assert starved["emulator"]["lateness_s"]["p99"] > 10 * fidelity.FRAME_TIME_10M_S
    # (the fed window's own verdict is the machine's: on a loaded machine it may be invalid too)
    assert fed["valid"] == (not fed["invalid_reasons"])
