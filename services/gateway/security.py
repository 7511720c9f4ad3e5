"""What every reply of the gateway carries, and which requests it refuses before routing.

- `SecurityHeaders`: a Content-Security-Policy that allows only the gateway's own scripts,
  styles and images (plus `data:`/`blob:` images: thumbnails and the user's own files),
  no framing, no referrer, no MIME sniffing; HSTS when served over HTTPS; `no-store`
  on every reply that does not set its own caching (patient images, case replies).
- `SameOrigin`: a state-changing request (POST, PUT, PATCH, DELETE) must come from the
  page itself: an `Origin` (or, without one, `Sec-Fetch-Site`) from another site is
  refused, and so is a body type a cross-site form can send without asking
  (text/plain, application/x-www-form-urlencoded).
- The Host allow-list is Starlette's `TrustedHostMiddleware` (DNS rebinding).
- `https_redirect`: what the plain-HTTP port answers when the page is served over HTTPS.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; "
                           "manifest-src 'self'; base-uri 'none'; frame-ancestors 'none'")
HSTS = "max-age=31536000"  # one year; no includeSubDomains: the gateway knows only its own host
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# What a state-changing request may carry: what the page sends. A cross-site <form> can
# send urlencoded, multipart or text/plain without a CORS preflight; multipart is refused
# by the Origin check and the CSRF token instead.
BODY_TYPES = {"application/json", "multipart/form-data"}


def _headers(scope) -> dict[bytes, bytes]:
    return dict(scope["headers"])


class SecurityHeaders:
    """ASGI middleware adding the headers above to every reply."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        https = scope.get("scheme") == "https"

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [(b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                            (b"x-content-type-options", b"nosniff"),
                            (b"x-frame-options", b"DENY"),
                            (b"referrer-policy", b"no-referrer"),
                            (b"cross-origin-opener-policy", b"same-origin"),
                            (b"cross-origin-resource-policy", b"same-origin")]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                if https:
                    headers.append((b"strict-transport-security", HSTS.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class SameOrigin:
    """ASGI middleware refusing (403, or 415 for a body type) a state-changing request from
    another origin. The request's own origin is its scheme and its Host header (which the
    Host allow-list has checked)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        own = f"{scope.get('scheme', 'http')}://{headers.get(b'host', b'').decode('latin-1')}"
        origin = headers.get(b"origin", b"").decode("latin-1")
        fetch_site = headers.get(b"sec-fetch-site", b"").decode("latin-1")
        body_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if origin and origin != own or not origin and fetch_site not in ("", "same-origin", "none"):
            return await refuse(send, 403, "this request came from another web site and was refused; "
                                           "use the PathMaster page itself")
        if body_type and body_type not in BODY_TYPES:  # no body (sign out) is no body type
            return await refuse(send, 415, "the request must be sent as JSON or as a file upload "
                                           "(multipart/form-data), as the page sends it")
        await self.app(scope, receive, send)


async def refuse(send, status: int, message: str) -> None:
    """Answer `status` with {"error": message}, closing the connection (a body may be unread)."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def https_redirect(https_port: int):
    """An ASGI app answering every request with a permanent redirect (308: the method and
    body are kept) to the same host, path and query on HTTPS port `https_port`.

    Mount it behind the Host allow-list: the Host header names where the redirect goes.
    """
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        host = _headers(scope).get(b"host", b"").decode("latin-1")
        hostname = urlsplit(f"//{host}").hostname or ""
        if ":" in hostname:
            hostname = f"[{hostname}]"  # an IPv6 literal
        port = "" if https_port == 443 else f":{https_port}"
        query = scope.get("query_string", b"").decode("latin-1")
        target = f"https://{hostname}{port}{scope.get('raw_path', b'').decode('latin-1') or scope['path']}"
        if query:
            target += f"?{query}"
        await send({"type": "http.response.start", "status": 308,
                    "headers": [(b"location", target.encode("latin-1")),
                                (b"content-length", b"0"), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": b""})

    return app
