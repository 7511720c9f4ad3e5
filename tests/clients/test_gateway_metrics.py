"""The gateway's Prometheus metrics: requests by route and status, case times by class and
outcome, refused sign-ins; served to this host and to admins only. No coordinator runs:
the case goes to an address where nothing listens and fails there."""

from __future__ import annotations

import dataclasses
import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clients.web import WebClient

WAIT_S = 30


def routable_address() -> str | None:
    """This host's address on its default route (not loopback), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the source address
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.fixture
def handle(nowhere):
    from services.gateway import start_gateway

    outside = routable_address()
    handle = start_gateway(nowhere, host="0.0.0.0", allowed_hosts=[outside] if outside else [])
    yield handle
    handle.stop()


def fetch(url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of a Prometheus text page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_requests_cases_and_refused_sign_ins_are_counted(handle):
    from services.synthetic import synthetic_case_cells

    image = synthetic_case_cells(1, seed=7)[0]["image"]
    assert fetch(handle.url + "api/login", json.dumps({"name": "ann", "password": "nope"}).encode(),
                 {"Content-Type": "application/json"})[0] == 401
    assert fetch(handle.url + "login/once?token=made-up")[0] == 400
    assert fetch(handle.url + "api/sites")[0] == 401          # no session
    assert fetch(handle.url + "no/such/page/4711")[0] == 404
    web = WebClient(handle, "dr-pat", "pathologist")
    events = web.post_case({"cell1.png": image})
    assert events[-1]["type"] == "error"                      # nothing listens at the coordinator's address

    status, page = fetch(handle.url + "metrics")              # from this host: allowed
    assert status == 200
    found = samples(page.decode())
    assert found[("pathmaster_gateway_requests_total",
                  (("method", "POST"), ("route", "/api/login"), ("status", "401")))] == 1
    assert found[("pathmaster_gateway_requests_total",
                  (("method", "GET"), ("route", "/api/sites"), ("status", "401")))] == 1
    assert found[("pathmaster_gateway_requests_total",
                  (("method", "GET"), ("route", "unmatched"), ("status", "404")))] == 1
    assert not any("4711" in str(key) for key in found)       # a path is never a label
    assert found[("pathmaster_gateway_login_failures_total", (("how", "password"),))] == 1
    assert found[("pathmaster_gateway_login_failures_total", (("how", "link"),))] == 1
    assert found[("pathmaster_gateway_case_seconds_count", (("class", "unknown"), ("outcome", "failed")))] == 1
    assert [dict(labels)["role"] for name, labels in found if name == "pathmaster_build_info"] == ["gateway"]


def test_metrics_from_another_host_need_an_admin(handle):
    outside = routable_address()
    if outside is None:
        pytest.skip("this host has no routable address to call the gateway from")
    port = handle.url.rstrip("/").rsplit(":", 1)[1]
    remote = dataclasses.replace(handle, url=f"http://{outside}:{port}/")  # the same gateway, called from outside loopback
    status, body = fetch(remote.url + "metrics")
    assert status == 403 and "administrators" in json.loads(body)["error"]
    pathologist = WebClient(remote, "dr-pat", "pathologist")
    assert pathologist.get("metrics")[0] == 403
    admin = WebClient(remote, "ada", "admin")
    status, kind, page = admin.get("metrics")
    assert status == 200 and kind.startswith("text/plain")
    assert "pathmaster_gateway_requests_total" in page.decode()
