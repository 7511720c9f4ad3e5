"""The site directory closes under look-ups still waiting: they end quietly, nothing starts
or is learnt afterwards, and the channels can then be closed (what the coordinator's stop
does while its thread learning the sites' class ports is still asking)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from qos.channels import ClassChannels
from qos.classes import DEFAULT_CLASSES
from services.coordinator.directory import SiteDirectory
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

WAIT_S = 20.0  # far less than the look-up's own timeout below


@pytest.fixture
def nobody():
    """A loopback address on which nothing listens (bound, never listening: refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_closing_ends_a_look_up_that_waits_and_nothing_starts_after_it(nobody):
    channels = ClassChannels({"nowhere": nobody}, DEFAULT_CLASSES)
    directory = SiteDirectory(["nowhere"], channels, predictor=None)
    errors: list[BaseException] = []

    def look_up():
        try:
            directory.resolve(["nowhere"], timeout_s=120.0)  # waits for a site that never comes
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    thread = threading.Thread(target=look_up, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while "nowhere" not in directory._lookups and time.monotonic() < deadline:
        time.sleep(0.01)  # until the Info call is in flight
    assert "nowhere" in directory._lookups, "the look-up never started"

    directory.close()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "closing the directory left its look-up waiting"
    assert errors == []

    channels.close()
    directory.resolve(["nowhere"], timeout_s=120.0)  # returns at once: no call on the closed channels
    directory.learn("nowhere", pb.SiteInfo(class_ports={"urgent": 1}, feature_schema="s"))
    assert not directory.knows("nowhere") and "nowhere" not in directory.schemas
    assert channels._channels == {}, "a closed directory opened a connection"
    assert directory.recheck("nowhere", "s", time.monotonic() + 5).result(timeout=0) is None
