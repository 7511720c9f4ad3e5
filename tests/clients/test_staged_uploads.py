"""Files uploaded as soon as they are chosen ("staged"), and cases that name them by id.

Over HTTP, against a gateway without a coordinator (staging needs none): a file is
checked when it arrives (a bad one is named with its problem), needs a session, the CSRF
token and the page's origin, is bounded per file, per user and in all, expires, is the
user's own (another user's id, an unknown id and an expired one are all refused), is
dropped by "Clear" and by signing out, and never reaches the audit log by name or id.
Against the test deployment: a case of staged ids runs like the same case uploaded whole.
In Chromium: the page uploads files as they are chosen, showing each one's progress,
sends only ids, and adds again files the gateway no longer holds.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import uuid
from urllib.parse import urlsplit

import numpy as np
import pytest
from PIL import Image

from tests.clients.browser import CASE_TIMEOUT_MS, choose_files_by_keyboard, open_page
from tests.clients.web import WebClient


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def one_file(name: str, data: bytes) -> tuple[bytes, str]:
    """(body, content type) of a one-file upload, as the page's FormData sends it."""
    boundary = uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            f'Content-Type: image/png\r\n\r\n').encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(web: WebClient, name: str, data: bytes, csrf: str | None = ""):
    """(status, JSON reply) of staging one file."""
    status, _, reply = web.post("api/upload", *one_file(name, data), csrf=csrf)
    return status, json.loads(reply)


def send(web: WebClient, refs: dict[str, str], request_class: str = "routine"):
    """(status, JSON reply) of a case of staged files {name: id}, when it is refused."""
    return web.post_json("api/case", {"request_class": request_class,
                                      "files": [{"name": n, "id": i} for n, i in refs.items()]})


@pytest.fixture(scope="module")
def cell():
    from services.synthetic import synthetic_case_cells

    return synthetic_case_cells(1, seed=7)[0]


@pytest.fixture
def lone(nowhere):
    """A gateway without a coordinator, with small staging limits."""
    from services.gateway import start_gateway
    from services.gateway.staging import StagingLimits

    handle = start_gateway(nowhere, staging=StagingLimits(user_files=3, user_bytes=400_000,
                                                          total_bytes=500_000))
    yield handle
    handle.stop()


def test_a_chosen_file_is_checked_when_it_arrives_and_a_bad_one_is_named(lone, cell):
    web = WebClient(lone)
    status, reply = upload(web, "c1.png", cell["image"])
    assert status == 200, reply
    assert reply["id"] == hashlib.sha256(cell["image"]).hexdigest()
    assert reply["role"] == "image" and reply["bytes"] == len(cell["image"])
    height, width = np.asarray(Image.open(io.BytesIO(cell["image"]))).shape[:2]
    assert (reply["width"], reply["height"]) == (width, height)
    assert upload(web, "c1-mask.png", cell["mask"])[1]["role"] == "mask"

    bad = {"notes.png": (b"a note, not a picture", "not an image file"),
           "notes.txt": (cell["image"], "not an image file"),
           "c2.png": (cell["image"][: len(cell["image"]) // 2], "truncated"),
           "c3-mask.png": (png(np.full((20, 20), 7, np.uint8)), "0-3"),
           "field.png": (png(np.zeros((1100, 1000, 3), np.uint8)), "crop the cell")}
    for name, (data, words) in bad.items():
        status, reply = upload(web, name, data)
        assert status == 400, (name, reply)
        assert reply["file"] == name and words in reply["problem"], (name, reply)
    assert lone.gateway.staged.usage("dr-pat")[0] == 2  # only the good files are held


def test_staging_needs_a_session_the_csrf_token_and_the_pages_origin(lone, cell):
    import urllib.request

    web = WebClient(lone)
    assert upload(web, "c1.png", cell["image"], csrf=None)[0] == 403
    assert upload(web, "c1.png", cell["image"], csrf="forged")[0] == 403
    body, kind = one_file("c1.png", cell["image"])
    foreign = urllib.request.Request(lone.url + "api/upload", data=body, headers={
        "Content-Type": kind, "X-CSRF-Token": web.csrf, "Origin": "https://elsewhere.example"})
    assert web.open(foreign)[0] == 403
    anonymous = urllib.request.Request(lone.url + "api/upload", data=body, headers={"Content-Type": kind})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=30)
    assert refused.value.code == 401
    assert lone.gateway.staged.total_bytes == 0


def test_staged_files_are_bounded_per_file_per_user_and_in_all(lone, cell):
    from services.gateway.upload import MAX_FILE_BYTES

    web = WebClient(lone)
    # Over one file's limit: refused from its Content-Length, before its body is read.
    parts = urlsplit(lone.url)
    cookies = "; ".join(f"{c.name}={c.value}" for c in web.jar)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"POST /api/upload HTTP/1.1\r\nHost: {parts.netloc}\r\nCookie: {cookies}\r\n"
                     f"X-CSRF-Token: {web.csrf}\r\nContent-Type: multipart/form-data; boundary=x\r\n"
                     f"Content-Length: {MAX_FILE_BYTES + 64 * 1024}\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):  # until the gateway closes: the body is never read
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413") and b"per file" in reply, reply[:300]
    rng = np.random.default_rng(1)
    noisy = [png(rng.integers(0, 256, (180, 180, 3), np.uint8)) for _ in range(5)]  # ~97 KB each
    for n in range(3):
        assert upload(web, f"n{n}.png", noisy[n])[0] == 200
    status, reply = upload(web, "n3.png", noisy[3])  # a 4th file: over user_files = 3
    assert status == 413 and "files waiting" in reply["problem"]
    assert upload(web, "n0-copy.png", noisy[0])[0] == 200  # the same bytes are held once

    other = WebClient(lone, name="dr-lee")
    for n in range(3):
        status, reply = upload(other, f"m{n}.png", noisy[(n + 2) % 5])
        if status != 200:
            break
    # 500 kB in all: the second user runs into the gateway's limit, not their own.
    assert status == 503 and "for all its users" in reply["problem"]
    assert lone.gateway.staged.total_bytes <= 500_000


def test_another_users_ids_unknown_ids_and_expired_ids_are_refused(lone, cell):
    web, other = WebClient(lone), WebClient(lone, name="dr-lee")
    file_id = upload(web, "c1.png", cell["image"])[1]["id"]
    for who in (other, web):
        refs = {"c1.png": file_id} if who is other else {"c1.png": "0" * 64}
        status, reply = send(who, refs)
        assert status == 409 and reply["missing"] == ["c1.png"], reply
    assert send(web, {"c1.png": "not-an-id"})[0] == 400
    assert send(web, {"c1/../c1.png": file_id})[0] == 400

    staged = lone.gateway.staged
    now = staged.clock()
    staged.clock = lambda: now + staged.limits.ttl_s + 1  # the time-to-live has passed
    status, reply = send(web, {"c1.png": file_id})
    assert status == 409 and reply["missing"] == ["c1.png"]
    assert staged.total_bytes == 0  # and the bytes are gone


def test_a_teacher_may_stage_but_not_send_urgent(lone, cell):
    teacher = WebClient(lone, name="t-ann", role="teacher")
    file_id = upload(teacher, "c1.png", cell["image"])[1]["id"]
    status, reply = send(teacher, {"c1.png": file_id}, "urgent")
    assert status == 403 and "teacher" in reply["error"]


def test_clear_and_sign_out_drop_staged_files_and_the_audit_log_names_no_file(lone, cell):
    web = WebClient(lone)
    file_id = upload(web, "patient-smith.png", cell["image"])[1]["id"]
    status, _, reply = web.open(_request(lone.url + "api/upload", "DELETE", web.csrf))
    assert status == 200 and json.loads(reply) == {"dropped": 1}
    assert lone.gateway.staged.total_bytes == 0
    upload(web, "patient-smith.png", cell["image"])
    assert web.post("api/logout", b"", "application/json")[0] == 200
    assert lone.gateway.staged.total_bytes == 0

    audit = lone.audit_path.read_text()
    assert '"action":"upload"' in audit
    assert "patient-smith" not in audit and file_id not in audit


def _request(url: str, method: str, csrf: str):
    import urllib.request

    return urllib.request.Request(url, method=method, headers={"X-CSRF-Token": csrf})


def test_a_case_of_staged_files_runs_like_the_same_case_uploaded_whole(gateway, case_dir):
    web = WebClient(gateway, name="dr-stage")
    refs = {}
    for path in sorted(case_dir.iterdir()):
        status, reply = upload(web, path.name, path.read_bytes())
        assert status == 200, reply
        refs[path.name] = reply["id"]
    body = {"request_class": "urgent", "case_id": "S26-0042",
            "files": [{"name": n, "id": i} for n, i in refs.items()]}
    import urllib.request

    request = urllib.request.Request(gateway.url + "api/case", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "X-CSRF-Token": web.csrf})
    with web.opener.open(request, timeout=120) as reply:
        assert reply.headers["Content-Type"] == "application/x-ndjson"
        events = [json.loads(line) for line in reply if line.strip()]
    accepted, summary = events[0], events[-1]
    assert accepted["type"] == "accepted" and accepted["rejected"] == []
    assert sorted(accepted["cells"]) == [f"cell{n}" for n in range(1, 7)]
    assert summary["type"] == "summary" and summary["sites_ok"] == 3, summary
    assert summary["case_id"] == "S26-0042"
    sites = [e for e in events if e["type"] == "site"]
    assert all(len(c["matches"]) == 5 for s in sites for c in s["cells"])


@pytest.mark.browser
def test_the_page_uploads_files_as_they_are_chosen_and_sends_only_ids(page, gateway, case_dir):
    held, released = [], []
    requests = []
    page.on("request", lambda r: requests.append(r) if "/api/" in r.url else None)

    def hold(route):  # uploads wait until the test has seen their progress bars
        (route.continue_() if released else held.append(route))

    page.route("**/api/upload", hold)
    open_page(page, gateway, name="dr-pick")
    files = sorted(case_dir.iterdir())
    choose_files_by_keyboard(page, files)
    page.wait_for_selector("#pairing tr[data-cell='cell1'] .file-mark.uploading progress")
    assert page.locator("#submit").is_disabled()
    assert "Adding" in page.locator("#case-status").inner_text()
    released.append(True)
    for route in held:
        route.continue_()
    page.wait_for_selector("#submit:not([disabled])", timeout=60_000)  # once no upload is pending
    assert page.locator("#pairing .file-mark.yes").count() == len(files)
    uploads = [r for r in requests if r.url.endswith("/api/upload")]
    assert len(uploads) == len(files)  # every file went up when it was chosen, before Send

    page.click("label[for='class-urgent']")
    page.click("#submit")
    page.wait_for_selector("#case-status.done", timeout=CASE_TIMEOUT_MS)
    cases = [r for r in requests if r.url.endswith("/api/case")]
    assert len(cases) == 1
    assert cases[0].headers["content-type"] == "application/json"
    sent = json.loads(cases[0].post_data)
    assert sorted(f["name"] for f in sent["files"]) == [p.name for p in files]
    assert len(cases[0].post_data) < 4096  # names and ids, no image
    assert page.locator(".cell-card:not(.rejected)").count() == 6

    # The gateway lets unused files expire; Send adds them again and the case still runs.
    staged = gateway.gateway.staged
    real = staged.clock
    try:
        staged.clock = lambda: real() + staged.limits.ttl_s + 1  # every file has expired
        page.click("#submit")
        page.wait_for_selector("#case-status.done", timeout=CASE_TIMEOUT_MS)
    finally:
        staged.clock = real
    cases = [r for r in requests if r.url.endswith("/api/case")]
    assert len(cases) == 3  # refused (409: missing), then sent again
    assert len([r for r in requests if r.url.endswith("/api/upload")]) == 2 * len(files)
