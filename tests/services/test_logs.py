"""Service logs: JSON lines that parse, nothing below --log-level, no bytes, bounded."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.logs import LOG_MESSAGE_CHARS, setup_logging

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def root_logger():
    """The root logger's handlers and level, put back after the test."""
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def test_json_lines_at_the_level_without_bytes(root_logger):
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log = logging.getLogger("pathmaster.test")
    log.debug("not written")
    log.info("cell %s: %d bytes", b"\x89PNG\r\n" * 100, 600)
    log.warning("long %s", "x" * (LOG_MESSAGE_CHARS * 2))
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["level"] for r in records] == ["INFO", "WARNING", "ERROR"]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert records[0]["message"] == "cell <600 bytes>: 600 bytes" and records[0]["logger"] == "pathmaster.test"
    assert len(records[1]["message"]) < LOG_MESSAGE_CHARS + 100
    assert "ValueError: bad" in records[2]["exc_info"]


def test_text_format_and_bad_level(root_logger):
    out = io.StringIO()
    setup_logging("warning", "text", stream=out)
    logging.getLogger("pathmaster.test").info("hidden")
    logging.getLogger("pathmaster.test").error("shown")
    assert "hidden" not in out.getvalue() and "ERROR pathmaster.test: shown" in out.getvalue()
    with pytest.raises(ValueError):
        setup_logging("loud", "json")


def serve_coordinator(tmp_path: Path, *options: str) -> list[dict]:
    """Start `pathmaster serve coordinator` (no Ray: no analysers; its one site is not
    there), stop it with SIGTERM once it serves; its standard error as parsed JSON lines."""
    config = tmp_path / "coordinator.toml"
    config.write_text('[coordinator]\nlisten = "127.0.0.1:0"\nanalysis_workers = 0\n\n'
                      '[[sites]]\nname = "nowhere"\naddress = "127.0.0.1:9"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pathmaster", "serve", "coordinator", "--config", str(config),
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # it prints its address once it serves
        assert "coordinator serving on" in line, proc.stderr.read() if proc.poll() is not None else line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in err.splitlines()]  # every line is one JSON object


def test_serve_writes_json_lines_and_obeys_log_level(tmp_path):
    records = serve_coordinator(tmp_path)  # default: info
    levels = {r["level"] for r in records}
    assert "INFO" in levels and "DEBUG" not in levels
    assert any(r["logger"] == "pathmaster.coordinator" and "WITHOUT TLS" in r["message"] for r in records)
    quiet = serve_coordinator(tmp_path, "--log-level", "error")
    assert all(r["level"] in ("ERROR", "CRITICAL") for r in quiet)
