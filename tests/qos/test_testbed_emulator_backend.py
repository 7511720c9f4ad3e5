"""The testbed with the user-space emulator (qos.emulator) as a link's backend, against the kernel's."""

from __future__ import annotations


import pytest

from qos.testbed import Testbed, load_config, netns
from qos.testbed.probe import ping
from qos.traffic.iperf import IperfServer, run_client

pytestmark = pytest.mark.netns

RATE = 10_000_000


@pytest.fixture(scope="module")
def testbed(netns_ok):
    pytest.importorskip("netfilterqueue")
    with Testbed(load_config().with_tag(netns.new_tag("em"))) as tb:
        yield tb


def tcp_frames_bps(tb: Testbed) -> float:
    with IperfServer(tb.host("B1"), 5201):
        return run_client(tb.master, tb.ip("B1"), port=5201, seconds=2, omit=0.5).frame_bps()


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


def test_emulated_and_kernel_fifo_give_the_same_throughput(testbed):
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 100}, subnets=["A"], backend="kernel")
    kernel_bps = tcp_frames_bps(testbed)
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 100}, subnets=["A"], backend="emulator")
    emulated_bps = tcp_frames_bps(testbed)
    assert emulated_bps >= 0.95 * RATE, f"{emulated_bps / 1e6:.2f} Mbit/s through the emulator"
    assert emulated_bps == pytest.approx(kernel_bps, rel=0.05)
    # Back to the kernel: the emulator process and its NFQUEUE rules are gone.
    testbed.set_strategy({"strategy": "fifo"}, subnets=["A"], backend="kernel")
    router = testbed.host("rA")
    assert "NFQUEUE" not in router.cmd("iptables", "-S")
    assert netns.pids(router.namespace) == []
