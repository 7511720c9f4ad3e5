"""The services' logs: one JSON object per line (or plain text for a person at a terminal).

`setup_logging(level, fmt)` configures the root logger of a service command (`serve`,
`demo`): each record becomes {"time", "level", "logger", "message"} plus any `extra`
fields, and "exc_info" for a traceback (python-json-logger's JsonFormatter). What may be
logged is bounded here, whatever a caller passes: a bytes argument (an image, a request)
is logged as "<N bytes>", never its content, and a message is cut at
`LOG_MESSAGE_CHARS`. Patient identifiers are the callers' care: INFO names a case
by its keyed `pathmaster.ids.log_tag` only. An exception that ends a thread is logged
too (an ERROR record of "pathmaster.threads" with its traceback), not printed as text.
"""

from __future__ import annotations

import logging
import sys
import threading


LOG_MESSAGE_CHARS = 4000                # a service log line's message is cut there (no runaway payloads)

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("json", "text")


class BoundedRecords(logging.Filter):
    """Bytes arguments become "<N bytes>"; the message is cut at `limit` characters."""

    def __init__(self, limit: int = LOG_MESSAGE_CHARS):
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(f"<{len(a)} bytes>" if isinstance(a, (bytes, bytearray, memoryview)) else a
                                for a in record.args)
        message = record.getMessage()
        if len(message) > self.limit:
            message = message[: self.limit] + f"... ({len(message) - self.limit} more characters)"
        record.msg, record.args = message, ()
        return True


def setup_logging(level: str = "info", fmt: str = "json", stream=None) -> logging.Handler:
    """Send every log record at `level` or above to `stream` (stderr), as JSON lines or text.

    Parameters
    ----------
    level : str
        One of `LEVELS`.
    fmt : str
        "json" (one object per line: time, level, logger, message) or "text".
    stream : file, optional
        Where the lines go; standard error by default.

    Returns
    -------
    logging.Handler
        The handler installed on the root logger (replacing any earlier one).
    """
    if level not in LEVELS or fmt not in FORMATS:
        raise ValueError(f"log level must be one of {LEVELS} and format one of {FORMATS}")
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter  # [site] extra: only service commands need it

        handler.setFormatter(JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
                                           rename_fields={"levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(BoundedRecords())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    threading.excepthook = log_thread_exception
    return handler


def log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook` for a service: the exception that ended a thread becomes one
    log record (Python's own hook writes a text traceback to standard error, which would
    break the one-JSON-object-per-line format). SystemExit ends a thread quietly, as there."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    logging.getLogger("pathmaster.threads").error("thread %s ended with %s", name, args.exc_type.__name__,
                                                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def add_arguments(parser, level: str = "info", fmt: str = "json") -> None:
    """--log-level and --log-format (with these defaults) on a service command's parser."""
    parser.add_argument("--log-level", choices=LEVELS, default=level,
                        help="the least severe log records written (default %(default)s)")
    parser.add_argument("--log-format", choices=FORMATS, default=fmt,
                        help="log records as JSON lines or plain text, on standard error (default %(default)s)")
