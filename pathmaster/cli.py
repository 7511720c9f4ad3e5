"""The `pathmaster` command. Each area of the project registers its own subcommands.

A commands module exposes `register(subparsers)`, which adds subparsers whose
`func(args) -> int` does the work. Heavy imports stay inside those functions so that
`pathmaster --help` is instant.

Every parser, at every level, shows its options' defaults in its help (`HelpFormatter`),
so a default is typed once, in `add_argument`. Output into a pipe that closes early
(``pathmaster query --json | head -1``) ends the command quietly with status 141, as a
command killed by SIGPIPE does in git or coreutils, never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import pathmaster

# What a shell reports for a command killed by SIGPIPE (128 + 13): a reader that stopped.
EXIT_CLOSED_PIPE = 141

COMMAND_MODULES = (
    "pathmaster.commands",        # synth, index, search, evaluate
    "services.commands",          # demo, serve, query
    "services.gateway.commands",  # batch
    "qos.testbed.commands",       # testbed up/down/status
    "services.experiment.commands",  # experiment list/run/report
    "services.config_commands",   # config schema
    "services.health",            # health (readiness probes, operators)
)


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when it has a default worth showing
    (not None, not False) and its help does not already state one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS or default == []
                or "default" in text.lower() or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with `HelpFormatter`; subcommand parsers inherit it."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pathmaster",
        description="PathMaster-QoS: distributed cytology image similarity with a QoS-aware transport.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {pathmaster.__version__}")
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
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
        return status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return closed_pipe()


def closed_pipe() -> int:
    """The reader of stdout went away: point stdout at /dev/null so that Python's final
    flush cannot fail again, and return EXIT_CLOSED_PIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
