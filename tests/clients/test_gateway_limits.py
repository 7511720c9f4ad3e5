"""What one HTTP client can make the gateway hold: slow or half-sent requests are cut off,
oversize and deeply nested bodies refused with a status and a message, and other clients
are served meanwhile. No coordinator is needed: these are answered by the gateway alone."""

from __future__ import annotations

import json
import socket
import urllib.request
from urllib.parse import urlsplit

import pytest

from services.gateway.limits import MAX_REQUEST_BYTES, json_depth
from tests.clients.web import WebClient

WAIT_S = 30  # upper bound on any one socket read: only a broken gateway makes a test wait this long


@pytest.fixture
def quick_gateway(nowhere):
    """A gateway with short head and body deadlines (0.5 s), in front of no coordinator."""
    from services.gateway import start_gateway

    handle = start_gateway(nowhere, head_timeout_s=0.5, body_timeout_s=0.5)
    yield handle
    handle.stop()


@pytest.fixture
def signed_in(quick_gateway) -> WebClient:
    return WebClient(quick_gateway)


def session_headers(web: WebClient) -> bytes:
    """The Cookie and CSRF headers of `web`'s session, for a request written by hand."""
    cookie = "; ".join(f"{c.name}={c.value}" for c in web.jar)
    return f"Cookie: {cookie}\r\nX-CSRF-Token: {web.csrf}\r\n".encode()


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=WAIT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def get_page(url: str) -> int:
    with urllib.request.urlopen(url, timeout=WAIT_S) as r:
        return r.status


def test_a_half_sent_head_is_cut_off_and_others_are_served_meanwhile(quick_gateway):
    stalled = [connect(quick_gateway.url) for _ in range(20)]
    try:
        for sock in stalled:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and nothing more
        assert get_page(quick_gateway.url) == 200  # the stalled ones hold no worker
        for sock in stalled:
            assert read_all(sock) == b""  # closed by the gateway, not by our read timeout
    finally:
        for sock in stalled:
            sock.close()


def test_a_half_sent_body_is_answered_408(quick_gateway, signed_in):
    with connect(quick_gateway.url) as sock:
        sock.sendall(b"POST /api/pair HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + session_headers(signed_in) + b"Content-Length: 100\r\n\r\n{\"names\": [")
        reply = read_all(sock)
    assert status_of(reply) == 408 and b"did not arrive in time" in reply


def test_bad_or_oversize_lengths_are_refused_before_the_body_is_read(quick_gateway):
    with connect(quick_gateway.url) as sock:
        sock.sendall(b"POST /api/pair HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n")
        assert status_of(read_all(sock)) == 400
    with connect(quick_gateway.url) as sock:
        sock.sendall(b"POST /api/case HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                     b"boundary=x\r\nContent-Length: %d\r\n\r\n" % (MAX_REQUEST_BYTES + 1))
        reply = read_all(sock)  # answered and closed without our sending a byte of the body
    assert status_of(reply) == 413 and b"over the gateway's" in reply


def test_deep_or_huge_json_is_refused_with_a_message(signed_in):
    def post_json(body: bytes) -> tuple[int, dict]:
        status, _, reply = signed_in.post("api/pair", body, "application/json")
        return status, json.loads(reply)

    status, reply = post_json(b'{"names": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "nests deeper" in reply["error"]
    names = json.dumps({"names": ["x" * 100] * 5000}).encode()  # ~0.5 MB of names
    status, reply = post_json(names)
    assert status == 413 and "over the limit" in reply["error"]
    status, reply = post_json(b'{"names": "cell1.png"}')
    assert status == 400 and "not what this call takes" in reply["error"]
    status, reply = post_json(json.dumps({"names": ["c1.png", "c1-mask.png"]}).encode())
    assert status == 200 and reply["cells"][0]["mask"] == "c1-mask.png"


def test_json_depth_counts_brackets_outside_strings():
    assert json_depth(b'{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert json_depth(b'"\\"[["') == 0 and json_depth(b"5") == 0


def test_the_api_is_described_by_openapi(quick_gateway):
    with urllib.request.urlopen(quick_gateway.url + "api/openapi.json", timeout=WAIT_S) as r:
        spec = json.loads(r.read())
    case = spec["paths"]["/api/case"]["post"]
    assert "multipart/form-data" in case["requestBody"]["content"]
    assert "application/x-ndjson" in case["responses"]["200"]["content"]
    assert {"/api/pair", "/api/image", "/api/sites", "/api/stats", "/api/config"} <= set(spec["paths"])
