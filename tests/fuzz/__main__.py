"""The long fuzz run: ``python -m tests.fuzz --long`` (run it with ``nice -n 10``).

Starts its own loopback deployment (three small synthetic sites on a local Ray, a
coordinator, a gateway), sends `--inputs` generated inputs to all their entry points
(tests/fuzz/suite.py ``any_call``), then a second round of `--second` more, and prints
the counts by target and status, every problem (a status not expected, a reply past its
deadline, something stored by a refused request, an exception in the call: a crash), and
the resident memory before, after the first round and after the second. Bounded in time
by `--minutes` (the rounds stop early, and say so). Exit status 1 when anything went wrong.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import traceback
from collections import Counter

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.suite import any_call
from tests.fuzz.targets import FuzzStack, Outcome, memory

BATCH = 200  # inputs per Hypothesis run; the time bound is checked between batches


class Tally:
    """Counts of outcomes by (target, status), and the problems, as they come."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.problems: list[str] = []

    def add(self, outcome: Outcome) -> None:
        self.counts[(outcome.target, outcome.status)] += 1
        if outcome.problem:
            self.problems.append(f"{outcome.target}: {outcome.problem}")
            print(f"  problem: {outcome.target}: {outcome.problem}; sent {outcome.sent[:300]}", flush=True)

    def crashed(self, exc: BaseException) -> None:
        self.counts[("(the call itself)", f"crash {type(exc).__name__}")] += 1
        self.problems.append("crash: " + "".join(traceback.format_exception(exc)[-3:]).strip())

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def run_round(stack: FuzzStack, inputs: int, tally: Tally, end: float, first_seed: int) -> None:
    """Send `inputs` generated inputs (fewer if time.monotonic() passes `end`) to `stack`."""
    batch = 0
    while tally.total < inputs and time.monotonic() < end:
        size = min(BATCH, inputs - tally.total)

        @seed(first_seed + batch)
        @settings(max_examples=size, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(call=any_call(stack))
        def one(call):
            if tally.total >= inputs or time.monotonic() >= end:
                return
            try:
                tally.add(call())
            except Exception as exc:  # noqa: BLE001 - counted and shown: a crash is what the run looks for
                tally.crashed(exc)

        one()
        batch += 1


def report(name: str, tally: Tally, seconds: float, mem: dict[str, float], healthy: bool) -> None:
    print(f"\n== {name}: {tally.total} inputs in {seconds:.0f} s; deployment healthy after: {healthy}")
    for (target, status), n in sorted(tally.counts.items()):
        print(f"  {target:28s} {status:22s} {n:6d}")
    problems = Counter(p.split(":")[0] + ": " + p.split(":", 1)[1][:160] for p in tally.problems)
    print(f"  problems: {len(tally.problems)}")
    for problem, n in problems.most_common(30):
        print(f"    {n:5d} x {problem}")
    print("  RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in mem.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="the long run (default: 200 + 100 inputs, a smoke test)")
    parser.add_argument("--inputs", type=int, help="inputs of the first round (default 10000 with --long)")
    parser.add_argument("--second", type=int, help="inputs of the second round (default 5000 with --long)")
    parser.add_argument("--minutes", type=float, default=60.0, help="stop both rounds after this long")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="the first batch's Hypothesis seed")
    args = parser.parse_args(argv)
    first = args.inputs or (10000 if args.long else 200)
    second = args.second if args.second is not None else (5000 if args.long else 100)
    logging.basicConfig(level=logging.WARNING)
    end = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="pathmaster-fuzz-") as root:
        stack = FuzzStack(root).start()
        try:
            print(f"seed {args.seed}; RSS MiB before: " + ", ".join(f"{k} {v:.0f}" for k, v in memory().items()),
                  flush=True)
            failed = False
            for name, inputs, offset in (("round 1", first, 0), ("round 2", second, 10**6)):
                tally, started = Tally(), time.perf_counter()
                run_round(stack, inputs, tally, end, args.seed + offset)
                healthy = stack.healthy()
                report(name, tally, time.perf_counter() - started, memory(), healthy)
                if tally.total < inputs:
                    print(f"  stopped at the time bound ({args.minutes:g} min): {tally.total} of {inputs} inputs")
                failed = failed or bool(tally.problems) or not healthy
        finally:
            stack.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
