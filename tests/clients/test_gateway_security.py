"""The gateway's own defences, answered before any coordinator is asked: security headers,
the Host allow-list, the same-origin rule for state-changing requests, HTTPS with HSTS."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.clients.web import WebClient

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30


@pytest.fixture
def plain_gateway(nowhere):
    from services.gateway import start_gateway

    handle = start_gateway(nowhere)
    yield handle
    handle.stop()


def request(url: str, method: str = "GET", path: str = "/", body: bytes | None = None,
            headers: dict | None = None, context: ssl.SSLContext | None = None):
    """(status, headers, body) of one request with exactly the headers given (Host included)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=WAIT_S, context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
    headers = {"Host": parts.netloc, **(headers or {})}
    try:
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


PAIR = json.dumps({"names": ["c1.png"]}).encode()


def test_replies_carry_security_headers_and_are_not_cached(plain_gateway):
    status, headers, page = request(plain_gateway.url)
    assert status == 200 and b"PathMaster" in page
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    assert headers["cache-control"] == "no-store"
    assert "strict-transport-security" not in headers  # plain HTTP: HSTS would mean nothing
    status, headers, _ = request(plain_gateway.url, path="/api/sites")  # an error reply too
    assert status == 401 and headers["cache-control"] == "no-store" and "content-security-policy" in headers


def test_a_foreign_host_is_refused(plain_gateway):
    status, _, _ = request(plain_gateway.url, headers={"Host": "rebound.example.com"})
    assert status == 400
    port = urlsplit(plain_gateway.url).port
    assert request(plain_gateway.url, headers={"Host": f"localhost:{port}"})[0] == 200


def test_a_cross_origin_post_is_refused(plain_gateway):
    own = plain_gateway.url.rstrip("/")
    json_type = {"Content-Type": "application/json"}
    status, _, body = request(plain_gateway.url, "POST", "/api/pair", PAIR,
                              {**json_type, "Origin": "http://evil.example"})
    assert status == 403 and "another web site" in json.loads(body)["error"]
    # The classic CSRF: a text/plain form from another site, no preflight.
    status, _, _ = request(plain_gateway.url, "POST", "/api/case", b"x=1",
                           {"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status == 403
    status, _, _ = request(plain_gateway.url, "POST", "/api/pair", PAIR,
                           {**json_type, "Sec-Fetch-Site": "cross-site"})
    assert status == 403
    # Without any Origin, a body type only a form sends is refused as well.
    status, _, body = request(plain_gateway.url, "POST", "/api/pair", PAIR, {"Content-Type": "text/plain"})
    assert status == 415 and "as the page sends it" in json.loads(body)["error"]
    # The page itself, signed in.
    web = WebClient(plain_gateway)
    session = {"Cookie": "; ".join(f"{c.name}={c.value}" for c in web.jar), "X-CSRF-Token": web.csrf}
    status, _, body = request(plain_gateway.url, "POST", "/api/pair", PAIR, {**json_type, **session, "Origin": own})
    assert status == 200 and json.loads(body)["cells"][0]["cell_id"] == "c1"
    status, _, _ = request(plain_gateway.url, "POST", "/api/pair", PAIR,
                           {**json_type, **session, "Origin": "http://evil.example"})
    assert status == 403  # a session does not make another site's request welcome


def test_https_with_the_projects_certificates_sends_hsts(nowhere, tmp_path):
    from qos.transport import TLSFiles
    from services.gateway import start_gateway

    subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(tmp_path), "gateway"],
                   check=True, timeout=120)
    handle = start_gateway(nowhere, https=TLSFiles(cert=tmp_path / "gateway.pem", key=tmp_path / "gateway.key"),
                           http_redirect_port=0)
    try:
        assert handle.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        status, headers, page = request(handle.url, context=context)
        assert status == 200 and b"PathMaster" in page
        assert headers["strict-transport-security"].startswith("max-age=")

        # Plain HTTP is sent to the HTTPS page, path and query kept, by the name the user typed.
        https_port = urlsplit(handle.url).port
        status, headers, _ = request(handle.http_url, path="/login/once?token=abc",
                                     headers={"Host": f"localhost:{urlsplit(handle.http_url).port}"})
        assert status == 308 and headers["location"] == f"https://localhost:{https_port}/login/once?token=abc"
        status, _, _ = request(handle.http_url, headers={"Host": "evil.example"})
        assert status == 400  # the Host allow-list holds on the plain port too
    finally:
        handle.stop()


def test_a_redirect_to_https_needs_https(nowhere):
    from services.gateway import start_gateway

    with pytest.raises(ValueError, match="needs HTTPS"):
        start_gateway(nowhere, http_redirect_port=0)
