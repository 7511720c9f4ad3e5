"""`pathmaster batch` (teaching-set queries to a file) and `pathmaster gateway` (the web page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.command_line import SignalStop, add_tls_arguments, tls_from_args
from services.shared import BATCH_CASE_CELLS, BATCH_JOBS, CASE_DEADLINE_S, COORDINATOR_PORT, GATEWAY_PORT
from services.gateway.accounts import ROLE_REFUSED_CLASSES

DEMO_COORDINATOR = f"127.0.0.1:{COORDINATOR_PORT}"  # where `pathmaster demo` listens
DEFAULT_STATE_DIR = Path.home() / ".local" / "state" / "pathmaster" / "gateway"
ROLE_NAMES = tuple(ROLE_REFUSED_CLASSES)


def register(subparsers) -> None:
    batch = subparsers.add_parser(
        "batch", help="run a folder of cells through the coordinator into a CSV/JSONL file",
        description="Run every cell under DIR through the coordinator. Cells pair with "
                    "NAME-background.* and NAME-mask.* by name; a cell in a folder named after a "
                    "diagnosis is labelled with it, and the summary gives per-class accuracy. "
                    "Resumable: run the same command again and finished cells are skipped.")
    batch.add_argument("dir", metavar="DIR", help="folder of cell images (class folders allowed)")
    batch.add_argument("--out", required=True, help="results file: .csv or .jsonl (appended to)")
    batch.add_argument("--class", dest="request_class", default="teaching",
                       help="one of the coordinator's request classes (default: %(default)s)")
    batch.add_argument("--coordinator", default=DEMO_COORDINATOR, metavar="HOST:PORT",
                       help="the coordinator's address (default %(default)s, where "
                            "`pathmaster demo` listens)")
    batch.add_argument("--jobs", type=int, default=BATCH_JOBS,
                       help="cases in flight at once: the concurrency limit (default %(default)s)")
    batch.add_argument("--case-size", type=int, default=BATCH_CASE_CELLS,
                       help="cells per case (default %(default)s)")
    batch.add_argument("--deadline", type=float, default=CASE_DEADLINE_S,
                       help="seconds one case may take before it is counted failed (default %(default)s)")
    batch.add_argument("--quiet", action="store_true", help="no progress bar")
    add_tls_arguments(batch)
    batch.set_defaults(func=run_batch_command)

    gateway = subparsers.add_parser(
        "gateway", help="serve the pathologist's web page for a running coordinator")
    gateway.add_argument("--coordinator", default=DEMO_COORDINATOR, metavar="HOST:PORT",
                         help="the coordinator's address (default %(default)s)")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--port", type=int, default=GATEWAY_PORT,
                         help="port (default %(default)s; 0: any free one)")
    gateway.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                         help="a host name browsers use to reach the page (repeatable); any other "
                              "Host is refused. The listening address and localhost are always allowed")
    gateway.add_argument("--https-cert", metavar="PEM",
                         help="serve the page over HTTPS with this certificate (e.g. from "
                              "deploy/make-certs.sh); needs --https-key")
    gateway.add_argument("--https-key", metavar="PEM", help="the HTTPS certificate's private key")
    gateway.add_argument("--http-redirect-port", type=int, metavar="PORT",
                         help="with HTTPS: also listen for plain HTTP on PORT and send every "
                              "request there to the HTTPS page (e.g. 80 beside 443)")
    gateway.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), metavar="DIR",
                         help="where the page's users (users.sqlite) and audit log (audit.log) "
                              "are kept, both 0600 (default %(default)s)")
    gateway.add_argument("--add-user", metavar="NAME",
                         help="add (or reset) user NAME with --role and a password read from the "
                              "terminal (or one line of standard input), then exit")
    gateway.add_argument("--role", choices=ROLE_NAMES, default="pathologist",
                         help="the role of --add-user: what kinds of case they may send "
                              "(default %(default)s)")
    gateway.add_argument("--login-link", metavar="NAME",
                         help="print a one-time sign-in link for user NAME once the page is served")
    add_tls_arguments(gateway)
    gateway.set_defaults(func=run_gateway_command)


def run_batch_command(args: argparse.Namespace) -> int:
    from qos.classes import UnknownClass
    from services.client import unknown_class_message
    from services.gateway.batch import BatchStopped, run_batch

    try:
        summary = run_batch(args.dir, args.out, args.coordinator,
                            request_class=args.request_class, jobs=args.jobs,
                            case_size=args.case_size, deadline_s=args.deadline,
                            progress=not args.quiet, tls=tls_from_args(args))
    except UnknownClass as exc:
        print(f"pathmaster batch: {unknown_class_message(exc, args.coordinator)}", file=sys.stderr)
        return 2
    except BatchStopped as exc:
        print(f"pathmaster batch: {exc}", file=sys.stderr)
        return 130  # stopped by SIGINT, as shells report it
    except (ValueError, FileNotFoundError) as exc:
        print(f"pathmaster batch: {exc}", file=sys.stderr)
        return 2
    print(summary.format())
    return 0 if summary.status_counts().get("failed", 0) == 0 else 1


def add_user_command(args: argparse.Namespace) -> int:
    import getpass

    from services.gateway.accounts import Accounts

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.add_user}: ")
        if getpass.getpass("again: ") != password:
            print("pathmaster gateway: the passwords differ; nothing changed", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        Accounts(Path(args.state_dir) / "users.sqlite").add_user(args.add_user, args.role, password)
    except ValueError as exc:
        print(f"pathmaster gateway: {exc}", file=sys.stderr)
        return 2
    print(f"user {args.add_user} ({args.role}) saved in {args.state_dir}")
    return 0


def run_gateway_command(args: argparse.Namespace) -> int:
    from services.gateway import start_gateway

    if args.add_user:
        return add_user_command(args)

    from qos.transport import TLSFiles

    stop = SignalStop()
    try:
        tls = tls_from_args(args)
        if bool(args.https_cert) != bool(args.https_key):
            raise ValueError("--https-cert and --https-key go together")
        https = TLSFiles(cert=args.https_cert, key=args.https_key) if args.https_cert else None
        handle = start_gateway(args.coordinator, host=args.host, port=args.port, tls=tls,
                               https=https, http_redirect_port=args.http_redirect_port,
                               allowed_hosts=args.allowed_host,
                               state_dir=args.state_dir)
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        print(f"pathmaster gateway: {exc}", file=sys.stderr)
        return 2
    print(f"PathMaster page: {handle.url}  (coordinator {args.coordinator}; Ctrl-C stops)",
          flush=True)
    if handle.http_url:
        print(f"plain HTTP at {handle.http_url} is sent to the HTTPS page", flush=True)
    if args.login_link:
        try:
            print(f"sign in once at: {handle.login_link(args.login_link)}", flush=True)
        except KeyError:
            print(f"pathmaster gateway: no user {args.login_link!r}; add one with --add-user",
                  file=sys.stderr)
    try:
        status = stop.wait()
    finally:
        handle.stop()
    return status
