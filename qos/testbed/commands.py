"""`pathmaster testbed up [--config FILE] [--tag TAG] [--network lan|2002] | down | status`."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("testbed", help="the 2002 QoS testbed in network namespaces (root)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (("up", "build the 9-host topology and its bottleneck queues"),
                       ("down", "remove the testbed's namespaces, veths, rules and processes"),
                       ("status", "show what of the testbed exists (JSON)")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("--config", metavar="FILE", help="testbed TOML (default: the packaged default.toml)")
        p.add_argument("--tag", help="override the config's tag (1-12 of a-z, 0-9)")
        if verb == "up":
            p.add_argument("--network", choices=("lan", "2002"),
                           help='override the config\'s network: "lan" (today\'s) or "2002" (the study\'s '
                                "10 Mbit/s cards on half-duplex hubs)")
        p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from qos.testbed.config import ConfigError, load_config
    from qos.testbed.testbed import Testbed, status, teardown

    try:
        config = load_config(args.config)
        if args.tag:
            config = config.with_tag(args.tag)
        if getattr(args, "network", None):
            config = config.with_network(args.network)
    except (ConfigError, ValueError) as exc:
        print(f"pathmaster testbed: {exc}", file=sys.stderr)
        return 2
    if args.verb == "status":
        print(json.dumps(status(config.tag), indent=2))
        return 0
    try:
        if args.verb == "up":
            tb = Testbed(config).up()
            s = tb.status()
            if config.network == "2002":
                print(f"testbed {config.tag} up (2002 network): {s['namespaces_present']} namespaces, "
                      f"10 Mbit/s cards on hubs, routers' hub {config.bottleneck.rate_kbit / 1e3:g} Mbit/s, "
                      f"strategy {config.bottleneck.discipline.get('strategy', 'fifo')}")
            else:
                print(f"testbed {config.tag} up: {s['namespaces_present']} namespaces, "
                      f"bottleneck {config.bottleneck.rate_kbit / 1e3:g} Mbit/s, "
                      f"{', '.join(sorted(set(s['disciplines'].values()))) or 'no kernel discipline'}")
        else:
            removed = teardown(config.tag)
            print(f"testbed {config.tag} down: removed {len(removed)} namespaces")
    except (RuntimeError, ValueError) as exc:  # CommandError, the emulator's errors, bad disciplines
        print(f"pathmaster testbed {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0
