"""Service logs: JSON lines that parse, nothing below --log-level, no bytes, bounded."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from services.logs import LOG_MESSAGE_CHARS, setup_logging

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def root_logger(monkeypatch):
    """The root logger's handlers and level, and threading's excepthook, put back after the test."""
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
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


def test_an_exception_that_ends_a_thread_is_one_json_record(root_logger):
    out = io.StringIO()
    setup_logging("info", "json", stream=out)

    def fail():
        raise RuntimeError("lost")

    thread = threading.Thread(target=fail, name="worker-1")
    thread.start()
    thread.join()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["level"], r["logger"]) for r in records] == [("ERROR", "pathmaster.threads")]
    assert "worker-1" in records[0]["message"] and "RuntimeError: lost" in records[0]["exc_info"]


def test_text_format_and_bad_level(root_logger):
    out = io.StringIO()
    setup_logging("warning", "text", stream=out)
    logging.getLogger("pathmaster.test").info("hidden")
    logging.getLogger("pathmaster.test").error("shown")
    assert "hidden" not in out.getvalue() and "ERROR pathmaster.test: shown" in out.getvalue()
    with pytest.raises(ValueError):
        setup_logging("loud", "json")


@pytest.fixture
def signal_handlers():
    """SIGINT's and SIGTERM's handlers and the signal wakeup fd, put back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    signal.set_wakeup_fd(wakeup)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_the_first_stop_signal_is_kept_whenever_it_comes(signal_handlers):
    from services.command_line import SignalStop

    early = SignalStop()
    signal.raise_signal(signal.SIGTERM)  # its handler runs now, in this (the main) thread
    signal.raise_signal(signal.SIGINT)
    assert early.wait() == 128 + signal.SIGTERM
    waiting = SignalStop()
    threading.Thread(target=signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGINT)).start()
    assert waiting.wait() == 128 + signal.SIGINT  # before or while it waits


STOP_WAIT_S = 60  # for the server to exit after SIGTERM


# SignalStop().wait() with SIGTERM handled at its n-th bytecode (the opcodes the main thread
# runs inside wait, those of the functions it calls included), for each n in turn; another
# thread takes one too (the kernel gives a process's signal to any thread not blocking it),
# which also ends the waits whose last bytecode came before n. Prints "stopped" when every
# wait returned; a handler that blocks on a lock the interrupted wait holds, or a wait that
# only a signal delivered to its own thread wakes, hangs instead.
AT_EVERY_BYTECODE = """
import signal, sys, threading
from services.command_line import SignalStop

for n in range(1, 400):
    seen = 0

    def tracer(frame, event, arg):
        global seen
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen += 1
            if seen == n:
                signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside wait
        return tracer

    stop = SignalStop()
    threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)).start()
    sys.settrace(tracer)
    status = stop.wait()
    sys.settrace(None)
    assert status == 128 + signal.SIGTERM, status
print("stopped")
"""


def test_a_signal_at_any_moment_of_the_wait_stops_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", AT_EVERY_BYTECODE], capture_output=True, text=True,
                              env=env, timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail("a signal handled inside SignalStop.wait() left it waiting")
    assert done.returncode == 0 and done.stdout.split() == ["stopped"], done.stderr


def serve_coordinator(tmp_path: Path, *options: str) -> list[dict]:
    """Start `pathmaster serve coordinator` (no Ray: no analysers; its one site is not
    there), stop it with SIGTERM once it serves; its standard error as parsed JSON lines.
    A server that does not exit in time is stopped with SIGABRT, on which Python's fault
    handler writes every thread's stack to its standard error, and the test fails with it."""
    config = tmp_path / "coordinator.toml"
    config.write_text('[coordinator]\nlisten = "127.0.0.1:0"\nanalysis_workers = 0\n\n'
                      '[[sites]]\nname = "nowhere"\naddress = "127.0.0.1:9"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "pathmaster", "serve", "coordinator",
                             "--config", str(config), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # it prints its address once it serves
        assert "coordinator serving on" in line, proc.stderr.read() if proc.poll() is not None else line
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=STOP_WAIT_S)
            pytest.fail(f"serve coordinator did not exit within {STOP_WAIT_S} s of SIGTERM; "
                        f"its standard error, with its threads' stacks at SIGABRT:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in err.splitlines()]  # every line is one JSON object


def test_serve_writes_json_lines_and_obeys_log_level(tmp_path):
    records = serve_coordinator(tmp_path)  # default: info
    levels = {r["level"] for r in records}
    assert "INFO" in levels and "DEBUG" not in levels and "ERROR" not in levels, records
    assert any(r["logger"] == "pathmaster.coordinator" and "WITHOUT TLS" in r["message"] for r in records)
    # Stopped as it starts (still asking its site's Info), it has nothing to say at "error".
    quiet = serve_coordinator(tmp_path, "--log-level", "error")
    assert quiet == []
