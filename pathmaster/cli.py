"""The `pathmaster` command. Each area of the project registers its own subcommands.

A commands module exposes `register(subparsers)`, which adds subparsers whose
`func(args) -> int` does the work. Heavy imports stay inside those functions so that
`pathmaster --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "pathmaster.commands",        # synth, index, search, evaluate
    "services.commands",          # demo, serve, query
    "services.gateway.commands",  # batch
    "qos.testbed.commands",       # testbed up/down/status
    "services.experiment.commands",  # experiment list/run/report
    "services.config_commands",   # config schema
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pathmaster",
        description="PathMaster-QoS: distributed cytology image similarity with a QoS-aware transport.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that area is not installed in this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
