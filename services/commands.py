"""`pathmaster demo`, `pathmaster serve site|coordinator`, `pathmaster query`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from pathmaster import defaults
from services.command_line import SignalStop, add_tls_arguments, tls_from_args
from services.shared import COORDINATOR_PORT, DEMO_CELLS, OTLP_ENDPOINT, QUERY_DEADLINE_S
from services.logs import add_arguments as add_log_arguments
from services.logs import setup_logging

STARTED = time.perf_counter()


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="3 sites + a coordinator on loopback, then one 6-cell case (the main job)",
        description="Start three sites (each its own synthetic database, built on first run and "
                    "cached) and a coordinator on loopback with a local Ray, submit a 6-cell case, "
                    "print each site's results as they stream in, then keep serving until Ctrl-C.")
    demo.add_argument("--once", action="store_true", help="exit after the case")
    demo.add_argument("--port", type=int, default=COORDINATOR_PORT,
                      help="coordinator port (default %(default)s; 0: any free)")
    demo.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (default: any free)")
    demo.add_argument("--cells", type=int, default=DEMO_CELLS,
                      help="cells per site database (default %(default)s)")
    demo.add_argument("--cache", type=Path, default=None,
                      help="where everything the demo writes goes: site databases, case log, the page's users "
                           "and audit log (default ~/.cache/pathmaster/demo and .../demo-gateway)")
    demo.add_argument("--data", type=Path, default=None,
                      help="build the sites from this dataset folder (e.g. Herlev), its slides dealt over the "
                           "three sites, instead of synthetic cells")
    demo.add_argument("--ray-address", default="", help="join this Ray cluster instead of starting one")
    demo.add_argument("--class", dest="request_class", default="urgent",
                      help="the case's class (default %(default)s)")
    demo.add_argument("--no-gateway", action="store_true", help="do not start the web page")
    demo.add_argument("--verbose", action="store_true",
                      help="every decision, time and distance in full, for a researcher (default: the plain words "
                           "a pathologist needs)")
    add_log_arguments(demo, level="warning", fmt="text")  # a person reads the demo's terminal
    demo.set_defaults(func=run_demo)

    serve = subparsers.add_parser("serve", help="run a site or the coordinator from a config file")
    which = serve.add_subparsers(dest="role", metavar="ROLE", required=True)
    site = which.add_parser("site", help="serve one site database (see deploy/site.example.toml)")
    site.add_argument("--config", required=True, type=Path, help="site TOML file")
    site.add_argument("--ray-address", default=None,
                      help='join this Ray cluster ("auto" or HOST:PORT); overrides the config')
    add_log_arguments(site)
    site.set_defaults(func=run_serve_site)
    coord = which.add_parser("coordinator", help="serve the coordinator (see deploy/coordinator.example.toml)")
    coord.add_argument("--config", required=True, type=Path, help="coordinator TOML file")
    add_log_arguments(coord)
    coord.set_defaults(func=run_serve_coordinator)

    query = subparsers.add_parser(
        "query", help="submit a case to a coordinator and print each site's matches",
        description="Submit the cells in IMAGE... as one case. NAME-background.EXT and NAME-mask.EXT "
                    "files given alongside NAME.EXT are sent as that cell's background and mask.")
    query.add_argument("images", nargs="+", metavar="IMAGE",
                       help="cell images, each optionally with its NAME-background.EXT and NAME-mask.EXT")
    query.add_argument("--coordinator", required=True, metavar="HOST:PORT")
    query.add_argument("--class", dest="request_class", default="routine",
                       help="one of the coordinator's request classes, e.g. urgent (default %(default)s)")
    query.add_argument("--k", type=int, default=defaults.K, help="matches per cell and site (default %(default)s)")
    query.add_argument("--deadline", type=float, default=QUERY_DEADLINE_S,
                       help="seconds (default %(default)s)")
    query.add_argument("--site", action="append", default=[], help="ask only this site (repeatable)")
    query.add_argument("--json", action="store_true", help="one JSON object per event, per line")
    query.add_argument("--verbose", action="store_true",
                       help="every decision in full, for a researcher (default: the plain words a pathologist needs)")
    query.add_argument("--ship", choices=("auto", "features", "images"), default="auto",
                       help="how cells go to the sites: features where a site shares the coordinator's "
                            "feature schema (analysed once), images elsewhere (default: %(default)s)")
    query.add_argument("--analyse-locally", action="store_true",
                       help="analyse the cells here and upload only their features (KB, not MB; with a "
                            "48 px patch a cell for sites that compare a learnt embedding); "
                            "needs a coordinator with the same feature schema")
    trace = query.add_argument_group("tracing (OpenTelemetry; off by default)")
    trace.add_argument("--trace-file", type=Path, metavar="JSONL",
                       help="append this case's client span, one JSON object per line, to JSONL")
    trace.add_argument("--trace-endpoint", metavar="URL",
                       help="send this case's client span to an OpenTelemetry collector (OTLP/gRPC), "
                            f"e.g. {OTLP_ENDPOINT}")
    add_tls_arguments(query)
    query.set_defaults(func=run_query)


# ------------------------------------------------------------------ printing results


def print_case(events, started: float, truth: dict | None = None, as_json: bool = False,
               audience: str = "plain") -> bool:
    """Print a case's events as they arrive, decisions in `audience`'s words; True when
    every site answered OK."""
    from services.case_words import format_plan, format_site_result, format_summary, planned_codes
    from services.gateway.events import case_event_json

    ok, said = True, {}
    for event in events:
        if as_json:
            print(json.dumps(case_event_json(event, with_thumbnails=False)), flush=True)
        elif event.HasField("plan"):
            print(format_plan(event.plan, audience), flush=True)
            said = planned_codes(event.plan)
        elif event.HasField("site_result"):
            result = event.site_result
            print(format_site_result(result, time.perf_counter() - started, truth, audience,
                                     said.get(result.site, frozenset())), flush=True)
        else:
            print(format_summary(event.summary, truth, audience, time.perf_counter() - started), flush=True)
        if event.HasField("site_result") and event.site_result.status_code != 0:
            ok = False
    return ok


def print_waits(events) -> bool:
    """Print a case's plan (the predicted waits) first, then each site's and the case's
    actual wait beside its prediction; True when every site answered OK."""
    from services.case_words import format_plan

    ok = True
    for event in events:
        if event.HasField("plan"):
            print(format_plan(event.plan), flush=True)
        elif event.HasField("site_result"):
            r = event.site_result
            ok = ok and r.status_code == 0
            predicted = f"predicted {r.predicted_s:.2f} s" if r.predicted_s else "not predicted"
            state = "answered" if r.status_code == 0 else "failed"
            print(f"    {r.site:<12} {state} in {r.timing.total_s:.2f} s ({predicted})", flush=True)
        else:
            s = event.summary
            predicted = f"predicted {s.predicted_s:.2f} s" if s.predicted_s else "not predicted"
            print(f"case {s.case_id}: {s.total_s:.2f} s ({predicted})", flush=True)
    return ok


# ------------------------------------------------------------------ demo


def _ports_text(class_ports: dict[str, int]) -> str:
    """"urgent=50071, routine=50072, ...": where each class is served (and marked)."""
    return ", ".join(f"{c}={p}" for c, p in class_ports.items())


def run_demo(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    from services.client import CoordinatorClient
    from services.demo import CASE_SEED, dataset_case, start_demo
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import synthetic_case_cells

    print("PathMaster demo on loopback WITHOUT TLS (for TLS/mutual TLS use `pathmaster serve` "
          "with a [tls] section; deploy/make-certs.sh makes certificates)", flush=True)
    cells, held_out = (dataset_case(args.data, CASE_CELLS) if args.data
                       else (synthetic_case_cells(CASE_CELLS, CASE_SEED), set()))
    try:
        deployment = start_demo(cells=args.cells, cache=args.cache, coordinator_port=args.port,
                                metrics_port=args.metrics_port, ray_address=args.ray_address, data=args.data,
                                held_out=frozenset(held_out))
    except OSError as exc:
        print(f"pathmaster demo: {exc}; is another demo running? try --port 0", file=sys.stderr)
        return 1
    gateway = None
    try:
        coordinator = deployment.coordinator
        for name, site in deployment.sites.items():
            print(f"site {name:<12} {site.address}  classes on ports {_ports_text(site.class_ports)}")
        print(f"coordinator       {coordinator.address}  classes on ports "
              f"{_ports_text(coordinator.class_ports)}  metrics {coordinator.metrics_url}")
        print(f"case log          {coordinator.config.case_log}")
        print(f"site databases    {f'real cells from {args.data}, dealt by slide over the sites' if args.data else 'synthetic cells'}"
              f"; the demo case is {CASE_CELLS} {'real cells from slides no site holds' if args.data else 'synthetic cells'}")
        if not args.no_gateway:
            gateway = _start_gateway(coordinator.address, args.cache)
        print(f"ready in {time.perf_counter() - STARTED:.1f} s (Ray included)", flush=True)

        truth = {c["cell_id"]: c["diagnosis"] for c in cells}
        case = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"],
                             mask=c["mask"]) for c in cells]
        print(f"\nsubmitting a 6-cell {args.request_class} case to all sites ...", flush=True)
        with CoordinatorClient(coordinator.address) as client:
            started = time.perf_counter()
            ok = print_case(client.submit(case, args.request_class), started, truth,
                            audience="full" if args.verbose else "plain")
            # The first case taught the coordinator each path (it measures its own transfers):
            # the same case again is predicted before it is sent, then timed.
            print("\nthe same case again, now that the coordinator has measured the paths ...", flush=True)
            ok = print_waits(client.submit(case, args.request_class)) and ok
        if args.once:
            return 0 if ok else 1
        print(f"\nserving; try: pathmaster query --coordinator {coordinator.address} --class urgent IMAGE...")
        print("Ctrl-C to stop", flush=True)
        SignalStop().wait()
        return 0
    finally:
        if gateway is not None:
            gateway.stop()
        deployment.stop()


CASE_CELLS = 6  # the demo case's test cells
DEMO_USER = "demo"  # the loopback demo's one user, a pathologist, signed in by a one-time link


def _start_gateway(coordinator_address: str, cache: Path | None = None):
    """The web page, when the gateway is part of this build; None otherwise. Its users and
    audit log are the demo's own (in `cache`/gateway, or the default cache's demo-gateway);
    the demo user signs in by a one-time link."""
    try:
        from services.gateway import start_gateway
    except ImportError:
        return None
    from services.synthetic import cache_root

    handle = start_gateway(coordinator_address, state_dir=Path(cache) / "gateway" if cache else cache_root() / "demo-gateway")
    if handle.accounts.role(DEMO_USER) is None:
        handle.accounts.add_user(DEMO_USER, "pathologist")  # no password: links only
    print(f"web page          {handle.url}")
    print(f"sign in once at   {handle.login_link(DEMO_USER)}")
    print(f"page audit log    {handle.audit_path}")
    return handle


# ------------------------------------------------------------------ serve


def run_serve_site(args: argparse.Namespace) -> int:
    from services.config import load_site_config
    from services.site.server import SiteServer

    def load(path):
        config = load_site_config(path)
        if args.ray_address is not None:
            config.ray_address = args.ray_address
        return config

    return _serve("site", load, SiteServer, args,
                  lambda s: f"site {s.config.name} serving on {s.address}; classes on ports {_ports_text(s.class_ports)}")


def run_serve_coordinator(args: argparse.Namespace) -> int:
    from services.config import load_coordinator_config
    from services.coordinator.server import CoordinatorServer

    return _serve("coordinator", load_coordinator_config, CoordinatorServer, args,
                  lambda s: f"coordinator serving on {s.address}; classes on ports {_ports_text(s.class_ports)}"
                            + (f"; metrics {s.metrics_url}" if s.metrics_url else ""))


def _serve(role: str, load, server_class, args: argparse.Namespace, describe) -> int:
    """Load `args.config`, start `server_class(config)`, print `describe(server)`, serve until
    SIGINT/SIGTERM; logs as `args.log_level` and `args.log_format` say. Exit status 2 for a
    bad configuration, 1 when the server cannot start."""
    setup_logging(args.log_level, args.log_format)
    config_path = args.config
    from pathmaster.records import ConfigError

    try:
        config = load(config_path)
    except ConfigError as exc:
        print(f"pathmaster serve {role}: {exc}", file=sys.stderr)
        return 2
    if config.tls is None:
        logging.getLogger(f"pathmaster.{role}").warning("serving WITHOUT TLS (add a [tls] section to %s)",
                                                         config_path)
    elif not config.tls.mutual:
        logging.getLogger(f"pathmaster.{role}").warning(
            "serving TLS without client certificates: any caller may call, whatever its role "
            "(set mutual = true in [tls] of %s)", config_path)
    try:
        server = server_class(config).start()
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"pathmaster serve {role}: {exc}", file=sys.stderr)
        return 1
    stop = SignalStop()  # before saying it serves: whoever then stops it stops it cleanly
    print(describe(server), flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    return 0


# ------------------------------------------------------------------ query


def run_query(args: argparse.Namespace) -> int:
    from pathmaster.records import InvalidInput
    from services.client import cells_from_files

    try:
        tls = tls_from_args(args)
        cells = cells_from_files(args.images)
        tracing = _query_tracing(args)
    except (InvalidInput, ValueError) as exc:
        print(f"pathmaster query: {exc}", file=sys.stderr)
        return 2
    try:
        return _run_query(args, tls, cells)
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the case's span before the process ends


def _query_tracing(args: argparse.Namespace):
    """Tracing in this client process as `--trace-file`/`--trace-endpoint` say (the SDK's
    TracerProvider to shut down at the end), or None."""
    if args.trace_file and args.trace_endpoint:
        raise ValueError("give --trace-file or --trace-endpoint, not both")
    if not (args.trace_file or args.trace_endpoint):
        return None
    from services.config import TracingTable
    from services.tracing import start_tracing

    settings = (TracingTable(exporter="jsonl", file=args.trace_file) if args.trace_file
                else TracingTable(exporter="otlp", endpoint=args.trace_endpoint))
    return start_tracing(settings, "pathmaster-query")


def _analyse_locally(client, cells, args: argparse.Namespace):
    """(the cells to send, the features to send with them) of a case analysed here: only
    the cells' ids, unless a site looks through an eye that cannot be opened here
    (``local_analysis_plan``): then the images too, for that site. What went and why is
    printed with --verbose (words) and --json (a line of type "analysis" with reason codes).
    InvalidInput when a cell cannot be analysed."""
    from services.client import (analyse_locally, images_without_network_why, local_analysis_plan,
                                 local_analysis_why)
    from services.reasons import as_json, words

    eyed, images_for, (identity, description) = local_analysis_plan(client.sites(), args.site)
    eye = None
    if identity:
        from services.coordinator.learnt import SiteEyes

        eye = SiteEyes().get(identity, description)
    ids, vectors, schema = analyse_locally(cells, eye=eye, identity=identity)
    whys = [local_analysis_why(len(vectors), eyed)]
    if images_for:
        whys.append(images_without_network_why(images_for))
    if args.json:
        print(json.dumps({"type": "analysis", "images_for": images_for, "reasons": as_json(whys)}), flush=True)
    elif args.verbose:
        for why in whys:
            print(words(why), flush=True)
    return (cells if images_for else ids), {"features": vectors, "feature_schema": schema}


def _run_query(args: argparse.Namespace, tls, cells) -> int:
    import grpc

    from pathmaster.records import InvalidInput
    from qos.classes import UnknownClass
    from services.client import CoordinatorClient, unknown_class_message

    client = CoordinatorClient(args.coordinator, tls)
    try:
        with client:
            try:
                client.request_class(args.request_class)  # the coordinator's table, not ours
            except UnknownClass as exc:
                print(f"pathmaster query: {unknown_class_message(exc, args.coordinator)}", file=sys.stderr)
                return 2
            started = time.perf_counter()
            local = {}
            if args.analyse_locally:
                try:
                    cells, local = _analyse_locally(client, cells, args)
                except InvalidInput as exc:
                    print(f"pathmaster query: {exc}", file=sys.stderr)
                    return 2
            events = client.submit(cells, args.request_class, k=args.k, deadline_s=args.deadline,
                                   sites=args.site, ship=args.ship, **local)
            ok = print_case(events, started, as_json=args.json, audience="full" if args.verbose else "plain")
    except grpc.RpcError as exc:
        print(f"pathmaster query: {client.describe(exc)}", file=sys.stderr)
        return 2 if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED) else 1
    return 0 if ok else 1
