"""Signing in at the page: passwords, one-time links, sessions and their CSRF token, the
login rate limit, roles deciding the classes a user may send, and the audit log. All of it
is answered by the gateway itself, so no coordinator runs here."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request

import pytest

from services.gateway.accounts import LOGIN_ATTEMPTS, SESSION_S
from tests.clients.web import WebClient, multipart

WAIT_S = 30
PASSWORD = "correct horse battery"


@pytest.fixture
def handle(nowhere):
    from services.gateway import start_gateway

    handle = start_gateway(nowhere)
    handle.accounts.add_user("ann", "pathologist", PASSWORD)
    yield handle
    handle.stop()


def call(url: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body) without cookies of our own."""
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def login(handle, name: str, password: str):
    return call(handle.url + "api/login", json.dumps({"name": name, "password": password}).encode(),
                {"Content-Type": "application/json"})


def audit(handle) -> list[dict]:
    return [json.loads(line) for line in handle.audit_path.read_text().splitlines()]


def test_a_password_sign_in_sets_a_locked_down_cookie_and_is_audited(handle):
    status, _, body = login(handle, "ann", "wrong password")
    assert status == 401 and json.loads(body)["error"] == "That name and password do not match."
    status, headers, body = login(handle, "ann", PASSWORD)
    assert status == 200 and json.loads(body)["role"] == "pathologist"
    cookie = headers["Set-Cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert f"max-age={SESSION_S}" in cookie
    assert [(a["action"], a["user"], a["from"]) for a in audit(handle)] == [
        ("sign-in-refused", "ann", "127.0.0.1"), ("sign-in", "ann", "127.0.0.1")]
    assert (handle.audit_path.stat().st_mode & 0o777) == 0o600
    assert ((handle.state_dir / "users.sqlite").stat().st_mode & 0o777) == 0o600
    assert PASSWORD not in handle.audit_path.read_text()


def test_without_a_session_nothing_but_the_page_is_served(handle):
    assert call(handle.url)[0] == 200  # the page, which then shows its sign-in form
    for path in ("api/config", "api/sites", "api/stats?class=urgent", "api/image?site=a&cell_id=b"):
        status, _, body = call(handle.url + path)
        assert status == 401 and json.loads(body)["error"] == "Please sign in.", path
    body, kind = multipart({"request_class": "routine"}, {"c.png": b"x"})
    assert call(handle.url + "api/case", body, {"Content-Type": kind})[0] == 401


def test_a_state_changing_request_needs_the_sessions_csrf_token(handle):
    web = WebClient(handle, "ann")
    names = {"names": ["c1.png"]}
    status, reply = web.post_json("api/pair", names, csrf=None)
    assert status == 403 and "security token" in reply["error"]
    assert web.post_json("api/pair", names, csrf="forged-token")[0] == 403
    assert web.post_json("api/pair", names)[0] == 200


def test_an_expired_or_forged_session_must_sign_in_again(handle):
    web = WebClient(handle, "ann")
    assert web.get("api/session")[0] == 200
    with sqlite3.connect(handle.state_dir / "users.sqlite") as db:
        db.execute("UPDATE sessions SET expires = 0")
    status, reply = web.get_json("api/session")
    assert status == 401 and reply["error"] == "Your session has ended; please sign in again."
    status, _, body = call(handle.url + "api/session", headers={"Cookie": "pathmaster_session=forged"})
    assert status == 401 and "sign in" in json.loads(body)["error"]


def test_a_one_time_link_signs_in_once(handle):
    link = handle.login_link("ann")
    status, _, page = call(link)  # redirected to the page
    assert status == 200 and b"PathMaster" in page
    status, _, page = call(link)
    assert status == 400 and b"has been used or has expired" in page
    with pytest.raises(KeyError):
        handle.login_link("nobody")


def test_repeated_failed_sign_ins_are_refused_for_a_while(handle):
    for _ in range(LOGIN_ATTEMPTS):
        assert login(handle, "ann", "guess")[0] == 401
    status, _, body = login(handle, "ann", PASSWORD)  # even the right one, until the window passes
    assert status == 429 and "wait a minute" in json.loads(body)["error"]


def test_a_teacher_cannot_send_an_intra_operative_case(handle):
    teacher = WebClient(handle, "tess", role="teacher")
    body, kind = multipart({"request_class": "urgent"}, {"c.png": b"x"})
    status, _, reply = teacher.post("api/case", body, kind)
    assert status == 403
    assert json.loads(reply)["error"] == ("As a teacher you cannot send Intra-operative — fastest "
                                          "cases; choose another kind of case.")
    refused = audit(handle)[-1]
    assert (refused["action"], refused["user"], refused["request_class"]) == ("case-refused", "tess", "urgent")


def test_the_gateway_command_adds_users(tmp_path, monkeypatch, capsys):
    import io

    from pathmaster.cli import main
    from services.gateway.accounts import Accounts

    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["gateway", "--state-dir", str(tmp_path), "--add-user", "tess", "--role", "teacher"]) == 0
    assert "tess" in capsys.readouterr().out
    accounts = Accounts(tmp_path / "users.sqlite")
    assert accounts.role("tess") == "teacher" and accounts.check_password("tess", PASSWORD)
    with pytest.raises(SystemExit) as exit_:
        main(["gateway", "--state-dir", str(tmp_path), "--add-user", "x", "--role", "king"])
    assert exit_.value.code == 2 and "'king'" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert main(["gateway", "--state-dir", str(tmp_path), "--add-user", "x"]) == 2
    assert "8 to" in capsys.readouterr().err
