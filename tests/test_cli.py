"""The `pathmaster` command collects every area's subcommands."""

import subprocess
import sys

from pathmaster.cli import build_parser


def test_help_lists_subcommands_of_every_area():
    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)
    expected = {"synth", "index", "search", "evaluate", "demo", "serve", "query", "batch", "testbed", "experiment",
                "config"}
    assert expected <= names, f"missing subcommands: {sorted(expected - names)}"


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "pathmaster", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "PathMaster-QoS" in out.stdout
