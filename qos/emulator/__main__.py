"""`python -m qos.emulator --config FILE [--stats OUT.json] [--duration S]`: run the emulator.

Run it inside the namespace whose forwarded packets it should shape (as root); it
inserts its iptables NFQUEUE rules, prints one line `READY {...}` on stdout when packets
may flow, and on SIGTERM/SIGINT (or after --duration) removes the rules, lets held
packets go and writes the statistics.
"""

from __future__ import annotations

import argparse
import sys

from qos.emulator.config import ConfigError, load_config, parse_time
from qos.emulator.runner import RuleError, run_from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qos.emulator",
                                     description="Run the user-space link emulator on NFQUEUE (as root, in a namespace).")
    parser.add_argument("--config", required=True, help="emulator TOML (or JSON) file")
    parser.add_argument("--stats", help="write per-run statistics (JSON) here")
    parser.add_argument("--duration", help="stop after this long (e.g. 30s); default: until signalled")
    parser.add_argument("--no-rules", action="store_true",
                        help="do not insert/delete the iptables rules (someone else manages them)")
    parser.add_argument("--no-realtime", action="store_true",
                        help="stay at normal scheduling priority (default: SCHED_FIFO, for timer accuracy)")
    parser.add_argument("--check", action="store_true", help="only check the configuration and exit")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        duration = parse_time(args.duration, "--duration") if args.duration else None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        for d in config.directions:
            print(f"{d.name}: queue {d.queue}, {' '.join(d.match)}, {d.settings.get('discipline', 'fifo')}")
        return 0
    try:
        run_from_args(config, args.stats, duration, rules=not args.no_rules, realtime=not args.no_realtime)
    except (RuleError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
