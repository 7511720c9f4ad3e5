"""The gateway's HTTP API against a real deployment: a case streams per site, bad files are
named and left out while the rest of the case goes ahead, a down site or coordinator is a
clear message, not a crash."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request

import pytest
from PIL import Image

from tests.clients.web import WebClient, multipart


def get(url: str):
    """(status, content type, body bytes) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def read_case(case_dir, *extra, cells=(1, 2, 3, 4, 5, 6)) -> dict[str, bytes]:
    """{name: bytes} of the case's files for the cells numbered `cells`, plus `extra` files."""
    files = {p.name: p.read_bytes() for p in sorted(case_dir.iterdir())
             if int(p.stem.split("-")[0].removeprefix("cell")) in cells}
    files.update({p.name: p.read_bytes() for p in extra})
    return files


@pytest.fixture(scope="module")
def web(gateway) -> WebClient:
    return WebClient(gateway)


@pytest.fixture(scope="module")
def down_web(down_gateway) -> WebClient:
    return WebClient(down_gateway)


def test_case_streams_each_sites_matches_and_keeps_good_cells_past_bad_files(
        web, gateway, case_dir, bad_files):
    # Two cells keep the sites' work short; the browser test runs the full 6-cell case.
    files = read_case(case_dir, bad_files["not_image"], bad_files["oversize"], cells=(1, 4))
    events = web.post_case(files)

    accepted = events[0]
    assert accepted["type"] == "accepted"
    assert accepted["cells"] == ["cell1", "cell4"]
    rejected = {r["name"]: r["problem"] for r in accepted["rejected"]}
    assert set(rejected) == {"scan-notes", "huge"}
    assert "not an image file" in rejected["scan-notes"] and "scan-notes.png" in rejected["scan-notes"]
    assert "over the limit" in rejected["huge"] and "huge.png" in rejected["huge"]
    paired = {c["cell_id"]: c for c in accepted["pairing"]["cells"]}
    assert paired["cell1"]["mask"] == "cell1-mask.png" and paired["cell4"]["mask"] is None

    sites = [e for e in events if e["type"] == "site"]
    assert sorted(e["site"] for e in sites) == ["site-a", "site-b", "site-c"]
    for site in sites:
        assert site["ok"] and site["status"] == "OK" and site["timing"]["total_s"] > 0
        assert [c["query_cell_id"] for c in site["cells"]] == accepted["cells"]
        for cell in site["cells"]:
            assert cell["error"] == "" and len(cell["matches"]) == 5
            distances = [m["distance"] for m in cell["matches"]]
            assert distances == sorted(distances)
            assert all(m["thumbnail"].startswith("data:image/webp;base64,") for m in cell["matches"])  # ~300 B, sized for the wire
        given = {c["query_cell_id"]: c for c in site["cells"]}
        assert not given["cell1"]["mask_estimated"] and given["cell4"]["mask_estimated"]

    summary = events[-1]
    assert summary["type"] == "summary" and summary["sites_ok"] == 3 and summary["sites_failed"] == 0
    assert sorted(v["query_cell_id"] for v in summary["votes"]) == accepted["cells"]
    assert all(v["total"] == 15 and 1 <= v["votes"] <= 15 for v in summary["votes"])

    # The match's full image, through the coordinator's GetImage.
    match = sites[0]["cells"][0]["matches"][0]
    status, kind, png = web.get(f"api/image?site={sites[0]['site']}&cell_id={match['cell_id']}")
    assert (status, kind) == (200, "image/png")
    audit = [json.loads(line) for line in gateway.audit_path.read_text().splitlines()]
    assert (gateway.audit_path.stat().st_mode & 0o777) == 0o600
    done = [a for a in audit if a["action"] == "case-done"][-1]
    assert done["case_id"] == summary["case_id"] and done["user"] == "dr-pat" and done["from"] == "127.0.0.1"
    assert [a for a in audit if a["action"] == "image"][-1]["cell_id"] == match["cell_id"]
    text = gateway.audit_path.read_text()
    assert "cell1" not in text and "scan-notes" not in text  # no file names (they may name a patient)
    assert Image.open(io.BytesIO(png)).size[0] > 0

    # The case is now in the class's recent completion times.
    status, _, body = web.get("api/stats?class=routine")
    stats = json.loads(body)
    assert status == 200 and stats["cases"] >= 1
    assert summary["total_s"] == pytest.approx(stats["recent_s"][-1], abs=1e-6)  # the page rounds to 1 µs


def test_down_site_is_reported_where_it_happened_and_the_others_still_answer(down_web, case_dir):
    events = down_web.post_case(read_case(case_dir, cells=(1, 4)), "urgent")
    sites = {e["site"]: e for e in events if e["type"] == "site"}
    assert set(sites) == {"site-a", "site-b", "site-down"}
    down = sites["site-down"]
    assert not down["ok"] and down["status"] == "UNAVAILABLE" and down["status_message"]
    assert all(len(c["matches"]) == 5 for s in ("site-a", "site-b") for c in sites[s]["cells"])
    summary = events[-1]
    assert (summary["sites_ok"], summary["sites_failed"]) == (2, 1)
    # Streamed, not buffered: the refused connection is on the page while the two live
    # sites are still extracting features: buffered, both would arrive together.
    assert events.index(down) < events.index(sites["site-a"])
    live_work_s = min(sites[s]["timing"]["site_wall_s"] for s in ("site-a", "site-b"))
    assert summary["_arrived"] - down["_arrived"] > 0.5 * live_work_s
    assert all(v["total"] == 10 for v in summary["votes"])

    status, _, body = down_web.get("api/sites")
    serving = {s["site"]: s["serving"] for s in json.loads(body)["sites"]}
    assert status == 200 and serving == {"site-a": True, "site-b": True, "site-down": False}


def test_bad_requests_get_a_clear_status_and_message(web, case_dir):
    status, _, body = web.get("api/stats?class=express")
    assert status == 400 and "express" in json.loads(body)["error"]
    assert "urgent" in json.loads(body)["error"]

    status, _, body = web.get("api/image?site=site-a&cell_id=no-such-cell")
    assert status == 404 and "no-such-cell" in json.loads(body)["error"]

    body, kind = multipart({"request_class": "routine"}, {"a/b.png": b"x"})
    status, _, reply = web.post("api/case", body, kind)
    assert status == 400 and "plain file name" in json.loads(reply)["error"]

    # Only bad files: nothing is sent, and the stream says why.
    events = web.post_case({"notes.txt": b"hello"})
    assert events[0]["rejected"][0]["name"] == "notes.txt"
    assert events[-1]["type"] == "error" and "nothing was sent" in events[-1]["message"]


def test_coordinator_down_is_a_message_not_a_crash(case_dir, nowhere):
    from services.gateway import start_gateway

    handle = start_gateway(nowhere)
    try:
        web = WebClient(handle)
        status, _, body = web.get("api/sites")
        assert status == 502 and "UNAVAILABLE" in json.loads(body)["error"]
        assert json.loads(body)["words"] == "The coordinator is not reachable; is it running?"
        events = web.post_case(read_case(case_dir, cells=(1,)))
        assert events[-1]["type"] == "error" and events[-1]["status"] == "UNAVAILABLE"
        assert events[-1]["words"] == "The coordinator is not reachable; is it running?"
        assert events[0]["cells"]  # the cells were fine; the coordinator was not there
        status, _, page = get(handle.url)
        assert status == 200 and b"PathMaster" in page
    finally:
        handle.stop()


def test_gateway_command_serves_the_page_until_interrupted(nowhere, tmp_path):
    import signal
    import subprocess
    import sys

    from services.gateway.accounts import Accounts

    Accounts(tmp_path / "users.sqlite").add_user("ann", "pathologist")
    proc = subprocess.Popen([sys.executable, "-m", "pathmaster", "gateway", "--coordinator", nowhere,
                             "--port", "0", "--state-dir", str(tmp_path), "--login-link", "ann"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the command prints its URL once it listens
        assert line.startswith("PathMaster page: http://127.0.0.1:"), line
        url = line.split()[2]
        status, kind, page = get(url)
        assert status == 200 and kind.startswith("text/html") and b"/static/app.js" in page
        status, kind, script = get(url + "static/app.js")
        assert status == 200 and kind.startswith("text/javascript") and b"api/case" in script
        assert get(url + "static/../server.py")[0] == 404
        assert get(url + "static/no-such-file.js")[0] == 404
        # Revalidated on every load, and answered 304 while unchanged (StaticFiles' ETag).
        with urllib.request.urlopen(url + "static/app.js", timeout=30) as first:
            etag, cache = first.headers["ETag"], first.headers["Cache-Control"]
        assert cache == "no-cache" and etag
        again = urllib.request.Request(url + "static/app.js", headers={"If-None-Match": etag})
        with pytest.raises(urllib.error.HTTPError) as unchanged:
            urllib.request.urlopen(again, timeout=30)
        assert unchanged.value.code == 304
        link = proc.stdout.readline()
        assert link.startswith(f"sign in once at: {url}login/once?token="), link
        assert get(link.split()[-1])[0] == 200  # signed in, sent on to the page
        assert '"action":"sign-in"' in (tmp_path / "audit.log").read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        # Exits with 130 on SIGINT: the wait only guards against a hang (0.3 s on a quiet
        # machine; once over 20 s with both cores kept busy beside the whole suite).
        assert proc.wait(timeout=90) == 130


@pytest.mark.parametrize("fmt, kind", [("WEBP", "webp"), ("JPEG", "jpeg"), ("PNG", "png")])
def test_a_thumbnail_becomes_a_data_url_of_its_own_type(fmt, kind):
    from services.gateway.events import png_data_url

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buffer, format=fmt)
    assert png_data_url(buffer.getvalue()).startswith(f"data:image/{kind};base64,")
    assert png_data_url(b"") == ""


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_gateway_command_stops_on_a_signal_even_when_started_with_sigint_ignored(nowhere, tmp_path, sig, code):
    """A script's background job inherits SIGINT ignored; the gateway still stops on it."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "pathmaster", "gateway", "--coordinator", nowhere,
                             "--port", "0", "--state-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline().startswith("PathMaster page: http://127.0.0.1:")
    finally:
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=90) == code  # guards against a hang only
