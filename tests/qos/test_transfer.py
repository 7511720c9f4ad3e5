"""qos.traffic.transfer on loopback: every byte counted, timed first to last byte."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

from qos.traffic import transfer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sink_counts_every_byte_and_splits_them_into_full_intervals():
    port, result, listening = free_port(), {}, threading.Event()
    sink = threading.Thread(target=lambda: result.update(transfer.receive(port, 0.002, timeout=10,
                                                                          ready=listening.set)))
    sink.start()
    assert listening.wait(10)
    transfer.send("127.0.0.1", port, 30_000_001, dscp=46)
    sink.join(10)
    assert result["bytes"] == 30_000_001
    assert result["seconds"] > 0
    # Only whole intervals are reported, so they hold at most what arrived.
    assert len(result["interval_bytes"]) == int(result["seconds"] // 0.002)
    assert sum(result["interval_bytes"]) <= result["bytes"]


def test_command_line_sink_prints_one_json_line():
    port = free_port()
    # The sink's timeout bounds its wait for the sender, whose own interpreter start takes
    # seconds on a busy host: a bound, not a wait (accept returns as the sender connects).
    sink = subprocess.Popen([sys.executable, "-m", "qos.traffic.transfer", "sink", str(port), "--timeout", "120"],
                            stdout=subprocess.PIPE, text=True)
    try:
        # The sink listens after its interpreter starts; the sender retries until it does.
        for _ in range(200):
            assert sink.poll() is None, "the sink stopped before a sender reached it"
            sent = subprocess.run([sys.executable, "-m", "qos.traffic.transfer", "send", "127.0.0.1", str(port),
                                   "12345", "--timeout", "10"], capture_output=True, text=True, timeout=60)
            if sent.returncode == 0 or "ConnectionRefused" not in sent.stderr:
                break
        assert sent.returncode == 0, sent.stderr
        out, _ = sink.communicate(timeout=10)
    finally:
        sink.kill()
    assert json.loads(out)["bytes"] == 12345
