"""What the tests send to the gateway the way a browser does."""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.error
import urllib.request
import uuid

WAIT_S = 30


def multipart(fields: dict[str, str], files: dict[str, bytes], field: str = "files") -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data upload, as a browser's FormData sends it
    (the files under form field `field`)."""
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    for name, data in files.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
                     f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
                     + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def login_link(handle, name: str = "dr-pat", role: str = "pathologist") -> str:
    """A one-time sign-in link at gateway `handle` for user `name` (added with `role` if new)."""
    if handle.accounts.role(name) is None:
        handle.accounts.add_user(name, role)
    return handle.login_link(name)


class WebClient:
    """A signed-in user of gateway `handle`, with its own cookies, sending the session's
    CSRF token with every POST as the page does."""

    def __init__(self, handle, name: str = "dr-pat", role: str = "pathologist"):
        self.url = handle.url
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        with self.opener.open(login_link(handle, name, role), timeout=WAIT_S) as reply:
            assert reply.status == 200  # redirected to the page, signed in
        status, session = self.get_json("api/session")
        assert status == 200, session
        self.csrf = session["csrf"]
        self.role = session["role"]

    def open(self, request):
        """(status, content type, body) of a request, errors included."""
        try:
            with self.opener.open(request, timeout=WAIT_S) as r:
                return r.status, r.headers["Content-Type"], r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers["Content-Type"], e.read()

    def get(self, path: str):
        return self.open(self.url + path)

    def get_json(self, path: str):
        status, _, body = self.get(path)
        return status, json.loads(body)

    def post(self, path: str, body: bytes, content_type: str, csrf: str | None = ""):
        """POST with the session's CSRF token (csrf="" : the session's; None: none)."""
        headers = {"Content-Type": content_type}
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf or self.csrf
        return self.open(urllib.request.Request(self.url + path, data=body, headers=headers))

    def post_json(self, path: str, obj, csrf: str | None = ""):
        status, _, body = self.post(path, json.dumps(obj).encode(), "application/json", csrf)
        return status, json.loads(body)

    def post_case(self, files: dict[str, bytes], request_class: str = "routine", **fields) -> list[dict]:
        """POST a case and read its whole NDJSON stream; the events in order, each with
        "_arrived": seconds from the request to the moment its line was read."""
        body, kind = multipart({"request_class": request_class, **fields}, files)
        request = urllib.request.Request(self.url + "api/case", data=body,
                                         headers={"Content-Type": kind, "X-CSRF-Token": self.csrf})
        started = time.monotonic()
        events = []
        with self.opener.open(request, timeout=120) as r:
            assert r.headers["Content-Type"] == "application/x-ndjson"
            assert r.headers["Cache-Control"] == "no-store"
            for line in r:
                if line.strip():
                    events.append({**json.loads(line), "_arrived": time.monotonic() - started})
        return events
