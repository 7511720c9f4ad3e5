"""The `pathmaster` command's manners: --version, defaults and positionals in every help,
a closed pipe ends it quietly, an unreachable coordinator gets a hint, not gRPC's text."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest

import pathmaster
from pathmaster.cli import EXIT_CLOSED_PIPE, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def every_parser(parser: argparse.ArgumentParser, path=("pathmaster",)):
    """(command words, parser) for the parser and every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, (*path, name))


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"pathmaster {pathmaster.__version__}"


def test_every_help_shows_defaults_and_describes_positionals():
    missing_default, undescribed = [], []
    for path, parser in every_parser(build_parser()):
        text = parser.format_help()  # every help renders
        assert text
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if not action.option_strings and not action.help:
                undescribed.append(f"{' '.join(path)} {action.dest}")
            default = action.default
            if action.option_strings and default not in (None, False, [], argparse.SUPPRESS):
                shown = formatter._expand_help(action) if action.help else ""
                number = isinstance(default, (int, float)) and f"{default:g}" in shown
                if "default" not in shown or not (str(default) in shown or number):
                    missing_default.append(f"{' '.join(path)} {action.option_strings[0]}={default!r}: {shown!r}")
    assert not undescribed, f"positional arguments without help: {undescribed}"
    assert not missing_default, f"options whose help does not show their default: {missing_default}"


def test_help_of_a_subcommand_shows_a_default_once():
    parser = dict(every_parser(build_parser()))[("pathmaster", "synth")]
    text = " ".join(parser.format_help().split())
    assert "(default 1400 = 7 x 200)" in text and "(default: 1400)" not in text
    assert "(default 0)" in text


@pytest.fixture
def cell_png(tmp_path) -> Path:
    from pathmaster.image.io import write_png

    return write_png(tmp_path / "cell.png", np.full((16, 16, 3), 200, np.uint8))


def test_unreachable_coordinator_is_a_hint_not_grpc_text(cell_png, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["query", "--coordinator", f"127.0.0.1:{port}", str(cell_png)])
    err = capsys.readouterr().err
    assert code == 1
    assert (f"The coordinator at 127.0.0.1:{port} is not reachable; is it running? "
            "(start one with `pathmaster demo` or `pathmaster serve coordinator`)") in err
    assert "failed to connect" not in err.lower() and "Traceback" not in err


@pytest.fixture
def chatty_coordinator():
    """A stand-in coordinator (no sites, no Ray) that streams many site results slowly."""
    import grpc

    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

    class Chatty(pb_grpc.CoordinatorServicer):
        def Info(self, request, context):
            return pb.CoordinatorInfo()

        def SubmitCase(self, request, context):
            for i in range(300):
                if not context.is_active():
                    return
                yield pb.CaseEvent(site_result=pb.SiteResult(site=f"site-{i}", status_code=0))
                time.sleep(0.01)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(Chatty(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_query_into_a_pipe_closed_early_exits_quietly(chatty_coordinator, cell_png):
    """`pathmaster query --json ... | head -1`: the reader takes one line and closes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "pathmaster", "query", "--coordinator", chatty_coordinator, "--json", str(cell_png)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        first = child.stdout.readline()
        child.stdout.close()  # what head does after its line
        code = child.wait(timeout=60)
        err = child.stderr.read().decode()
    finally:
        if child.poll() is None:
            child.kill()
        child.stderr.close()
    assert first.startswith(b"{")
    assert code == EXIT_CLOSED_PIPE == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
