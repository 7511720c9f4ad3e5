"""The testbed with the user-space emulator (qos.emulator) as a link's backend, against the kernel's."""

from __future__ import annotations


import pytest

from qos import netns
from qos.testbed import Testbed, load_config
from qos.testbed.probe import ping
from qos.traffic import burst

pytestmark = [pytest.mark.netns, pytest.mark.timing]

RATE = 10_000_000


@pytest.fixture(scope="module")
def testbed(netns_ok):
    pytest.importorskip("netfilterqueue")
    with Testbed(load_config().with_tag(netns.new_tag("em"))) as tb:
        yield tb


def fifo_burst(tb: Testbed, port: int) -> tuple[int, float]:
    """A 300-packet UDP burst into the 100-packet FIFO: packets through and link time per packet (s).

    Read from the packets' order and the kernel's receive times (qos.traffic.burst), so
    a busy machine, which delays everything, does not change either."""
    sent, packets = burst.through(tb.master, tb.host("B1"), [(0, 300)], port=port)
    assert sent["sent"] == [300]
    return len(packets), burst.service_s(packets)


def test_rtt_is_twice_the_emulated_delay(testbed):
    delay_ms = 10.0
    # Subnet A's uplink only, both directions: A1 -> B1 crosses it once each way.
    testbed.set_strategy({"strategy": "fifo", "delay_ms": delay_ms}, subnets=["A"], backend="emulator")
    assert testbed.status()["emulators"].keys() == {"A"}
    rtts = ping(testbed.master, [testbed.ip("B1")], count=7)[testbed.ip("B1")]
    assert None not in rtts
    # Every packet waits its delay once each way: no RTT is shorter than twice the delay.
    assert min(rtts) >= 2 * delay_ms, rtts
    # ...and not more than once: the quickest ping (the one a busy host delayed least) is well
    # under three delays. (The median also carries the host's scheduling delay, so it is not used.)
    assert min(rtts) < 2.5 * delay_ms, rtts


def test_emulated_and_kernel_fifo_pace_a_backlog_alike(testbed):
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 100}, subnets=["A"], backend="kernel")
    kernel_kept, kernel_s = fifo_burst(testbed, 5211)
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 100}, subnets=["A"], backend="emulator")
    emulated_kept, emulated_s = fifo_burst(testbed, 5212)
    frame_s = burst.FRAME_BYTES * 8 / RATE
    assert emulated_s == pytest.approx(frame_s, rel=0.03), f"{emulated_s * 1e3:.4f} ms a packet through the emulator"
    assert emulated_s == pytest.approx(kernel_s, rel=0.03)
    # Both kept a full buffer and dropped the rest (those the link sent meanwhile pass too).
    assert 100 <= emulated_kept < 300 and 100 <= kernel_kept < 300, (emulated_kept, kernel_kept)
    # Back to the kernel: the emulator process and its NFQUEUE rules are gone.
    testbed.set_strategy({"strategy": "fifo"}, subnets=["A"], backend="kernel")
    router = testbed.host("rA")
    assert "NFQUEUE" not in router.cmd("iptables", "-S")
    assert netns.pids(router.namespace) == []
