"""A strategy's `rto_min_ms`: the end hosts' minimum TCP retransmission timeout."""

from __future__ import annotations

import re
import sys

import pytest

from pathmaster.records import ConfigError
from qos import netns
from qos.experiment.spec import LINUX_RTO_MIN_MS, RTO_MIN_MS_RANGE, parse_spec
from qos.testbed import Testbed, load_config

PORT = 5419
# Accepts one connection and echoes what it reads until the peer closes (bounded by a timeout).
ECHO = ("import socket; s = socket.create_server(('{ip}', {port})); s.settimeout(60); c, _ = s.accept(); "
        "c.settimeout(60)\nwhile (d := c.recv(4096)): c.sendall(d)")


def spec(**strategy) -> dict:
    return {"experiment": {"name": "t"}, "strategies": {"a": {"discipline": "fifo", **strategy}},
            "links": [{"name": "10M", "core_kbit": 10000}]}


def test_rto_min_is_bounded_and_kept_out_of_older_fingerprints():
    low, high = RTO_MIN_MS_RANGE
    for bad in (low - 1, high + 1):
        with pytest.raises(ConfigError, match="rto_min_ms"):
            parse_spec(spec(rto_min_ms=bad))
    assert parse_spec(spec(rto_min_ms=20)).strategies[0].rto_min_ms == 20
    assert "rto_min_ms" not in parse_spec(spec()).to_dict()["strategies"][0]
    assert parse_spec(spec()).fingerprint() != parse_spec(spec(rto_min_ms=20)).fingerprint()


def socket_rto_ms(tb: Testbed, client: str, server: str) -> float:
    """The kernel's retransmission timeout (ss -ti) of a fresh TCP connection client -> server, ms,
    after a few round trips."""
    ip = tb.ip(server)
    echo = tb.host(server).popen([sys.executable, "-c", ECHO.format(ip=ip, port=PORT)])
    try:
        tb.host(server).wait_listening(PORT)
        probe = (f"import socket, subprocess; c = socket.create_connection(('{ip}', {PORT}), timeout=30)\n"
                 "for _ in range(20): c.sendall(b'x'); c.recv(1)\n"
                 f"print(subprocess.run(['ss', '-tin', 'dst', '{ip}:{PORT}'], capture_output=True, text=True).stdout)")
        out = tb.host(client).cmd(sys.executable, "-c", probe, timeout=60)
    finally:
        netns.stop_process(echo)
    found = re.search(r"\brto:([0-9.]+)", out)
    assert found, out
    return float(found.group(1))


@pytest.mark.netns
@pytest.mark.timing
def test_set_rto_min_reaches_the_end_hosts_sockets_and_goes_away(netns_ok):
    with Testbed(load_config().with_tag(netns.new_tag("r"))) as tb:
        assert socket_rto_ms(tb, "A1", "B1") >= LINUX_RTO_MIN_MS  # Linux's default first
        tb.set_rto_min(["A1", "B1", "C1"], 20)
        assert {tb.rto_min_ms(a, b) for a in ("A1", "B1", "C1") for b in ("A1", "B1", "C1") if a != b} == {20}
        assert tb.rto_min_ms("A1", "B3") is None  # other traffic (the competing downloads) keeps the default
        assert socket_rto_ms(tb, "A1", "B1") < 50
        assert socket_rto_ms(tb, "B1", "A1") < 50
        tb.set_rto_min(["A1", "B1", "C1"], None)
        assert tb.rto_min_ms("A1", "B1") is None
        assert socket_rto_ms(tb, "A1", "B1") >= LINUX_RTO_MIN_MS
