"""Give a process tree back normal scheduling: every thread under PID that runs SCHED_IDLE.

`make test` starts the rest of the suite under SCHED_IDLE beside the measuring tests, so
that it takes only the CPU they leave. Once they are done, nothing needs protecting and the
rest must not starve behind whatever else the machine runs: this switches every thread of
PID and its descendants (Ray, sites, browsers they started meanwhile) from SCHED_IDLE to
SCHED_OTHER. Other policies (an emulator's SCHED_FIFO) are left as they are. Scheduling
policy is per thread on Linux and a child takes its parent's at fork, so every thread is
visited and what starts afterwards is normal.

Other work can also start on the machine while the measuring tests run; idle-class, the rest
would then get no CPU and fail on their timeouts (a deployment not up in 120 s). `--watch`
switches them as soon as they are starved by it: under a quarter of a core for the rest
while work other than theirs and the measuring tests' (BESIDE) takes a core or more, three
5-s samples running. The measuring tests alone may take both cores for a while (a testbed
starting): that is not a reason.

Usage: python tests/unidle.py PID                         switch now
       python tests/unidle.py --watch PID --beside BESIDE switch once starved (ends then, or with PID)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from qos.experiment.fidelity import cpu_times
from services.fate import descendants

SAMPLE_S = 5.0
STARVED_CORES = 0.25  # the rest got under this share of the CPU ...
OTHER_CORES = 1.0     # ... while other work took at least this ...
STARVED_SAMPLES = 3   # ... this many samples running: starved
WATCH_MAX_S = 7200.0  # a watcher never outlives a CI run
TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by `root` and the processes now under it."""
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(v) for v in fields[11:15])  # its own and its reaped children's user and system time
    return total / TICKS


def machine_busy_s() -> float:
    """CPU seconds every core has been busy so far (idle and iowait are not busy)."""
    ticks = cpu_times()
    return (sum(ticks.values()) - ticks["idle"] - ticks["iowait"]) / TICKS


def watch(root: int, beside: int | None = None, sample_s: float = SAMPLE_S, samples: int = STARVED_SAMPLES) -> bool:
    """Sample every `sample_s`; unidle `root` once work other than its tree and `beside`'s
    has starved it `samples` samples running. True when it was switched, False when `root`
    ended (or WATCH_MAX_S passed)."""
    def now() -> tuple[float, float, float]:
        return tree_cpu_s(root), tree_cpu_s(beside) if beside else 0.0, machine_busy_s()

    starved, last, started = 0, now(), time.monotonic()
    while time.monotonic() - started < WATCH_MAX_S and Path(f"/proc/{root}").exists():
        time.sleep(sample_s)  # a sampling period, not a wait for an event
        current = now()
        rest, measuring, busy = ((b - a) / sample_s for a, b in zip(last, current))
        last = current
        starved = starved + 1 if rest < STARVED_CORES and busy - rest - measuring >= OTHER_CORES else 0
        if starved >= samples:
            print(f"make test: other work keeps the machine busy; {unidle(root)} threads of the rest "
                  "back to normal scheduling", flush=True)
            return True
    return False


def unidle(root: int) -> int:
    """Switch every SCHED_IDLE thread of `root` and its descendants to SCHED_OTHER; how many."""
    switched = 0
    for pid in [root, *descendants(root)]:
        try:
            threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in threads:
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    switched += 1
            except OSError:
                continue  # ended meanwhile
    return switched


if __name__ == "__main__":
    if sys.argv[1] == "--watch":
        watch(int(sys.argv[2]), int(sys.argv[4]) if sys.argv[3:4] == ["--beside"] else None)
    else:
        print(f"make test: {unidle(int(sys.argv[1]))} threads of the rest back to normal scheduling")
