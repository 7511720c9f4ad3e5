"""Whether a run measured the network or the machine: each run's own fidelity record and verdict.

The testbed's hubs and routers are a user-space process (qos.emulator) that shares two cores
with everything else on the machine. When it falls behind, packets leave later than the
emulated link would have sent them and the run times the machine, not the strategy. So every
run records, for the window of its case:

* the emulator's release lateness (actual minus scheduled release, per packet): p50, p99 and
  max, from the difference of the cumulative lateness histograms in the emulators' snapshots
  (`qos.emulator.stats.LATENESS_EDGES_S`; to within a bin, +26 %);
* the NFQUEUE's kernel drops (`queue_dropped`: the queue was full; `user_dropped`: the
  process's socket buffer was) per emulator and queue: packets the model never saw;
* the machine's CPU (/proc/stat: busy and steal fractions of all cores) and load average
  (/proc/loadavg) over the window.

`judge` marks a run invalid when its emulator fell behind past `FidelityBound`; the runner
runs it again (at most `MAX_ATTEMPTS` times in all) and the report counts both.

Keeping other testbeds off the machine while an experiment runs is qos.machine's lock.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

from qos.emulator.stats import LATENESS_EDGES_S, histogram_quantiles

# One full Ethernet frame (1514 B + 24 B of preamble, FCS and gap) takes 1.23 ms on the
# 10 Mbit/s hub: an emulator whose 99th-percentile release is later than one frame time has
# let the medium run measurably slower than 10 Mbit/s for those packets.
FRAME_TIME_10M_S = (1514 + 24) * 8 / 10e6
# The bound as the histogram can state it: the first bin edge at or above one frame time
# (1.26 ms), since the measured quantiles are bin edges (+26 % at most).
P99_BOUND_S = min(edge for edge in LATENESS_EDGES_S if edge >= FRAME_TIME_10M_S)
MAX_ATTEMPTS = 3  # a run judged invalid is run again, at most this many attempts in all

T = TypeVar("T")


@dataclass(frozen=True)
class FidelityBound:
    """What a valid run's emulator must have kept to during its case.

    p99_lateness_s : the 99th percentile of release lateness (default one frame time on the
        10 Mbit/s hub, FRAME_TIME_10M_S, as the histogram's next bin edge: P99_BOUND_S).
    max_lateness_s : the worst release (default 200 ms, Linux's minimum TCP retransmission
        timeout: a later release can by itself make a sender time out).
    nfqueue_drops : packets the kernel dropped before the emulator saw them (default 0).
    runnable_median : the median of the machine's runnable tasks over the case (sampled every
        half second); None (default): recorded, not judged. /proc/stat counts tasks of every
        scheduling class, so a machine whose other work runs at SCHED_IDLE (the test suite
        beside CI's smoke experiment) would look crowded: an experiment meant for a quiet
        machine declares it (`[fidelity]`, as pathmaster2002-contested does, with its reason).
    steal_median : the median share of CPU time the hypervisor took; None (default): recorded,
        not judged; declared like `runnable_median`.
    """

    p99_lateness_s: float = P99_BOUND_S
    max_lateness_s: float = 0.200
    nfqueue_drops: int = 0
    runnable_median: float | None = None
    steal_median: float | None = None


DEFAULT_BOUND = FidelityBound()


# -- the machine ------------------------------------------------------------------------------

def cpu_times(path: str | Path = "/proc/stat") -> dict[str, int]:
    """The machine's cumulative CPU times (USER_HZ ticks) from the first line of /proc/stat."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    fields = Path(path).read_text().splitlines()[0].split()[1:1 + len(names)]
    return {n: int(v) for n, v in zip(names, fields)}


def runnable_tasks(path: str | Path = "/proc/stat") -> int | None:
    """Tasks running or ready to run right now (/proc/stat's procs_running, this reader included)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def load_average(path: str | Path = "/proc/loadavg") -> float:
    """The 1-minute load average."""
    return float(Path(path).read_text().split()[0])


def machine_sample() -> dict:
    """A point-in-time sample of the machine: monotonic time, CPU times, runnable tasks, load average."""
    return {"t": time.monotonic(), "cpu": cpu_times(), "runnable": runnable_tasks(), "loadavg_1m": load_average(),
            "cpus": os.cpu_count()}


def _fractions(before: dict, after: dict) -> dict:
    d = {k: after["cpu"][k] - before["cpu"].get(k, 0) for k in after["cpu"]}
    total = sum(d.values())
    frac = (lambda v: v / total) if total > 0 else (lambda v: None)
    return {"busy": frac(total - d["idle"] - d["iowait"]), "steal": frac(d["steal"]), "iowait": frac(d["iowait"])}


def machine_window(before: dict, after: dict, during: list[dict] | None = None) -> dict:
    """The machine over a window: CPU busy and steal fractions (of all cores) between two
    `machine_sample`s, the load average at both ends, and from the samples taken `during` the
    window (every SAMPLE_S) the medians that judge it.

    `samples` is [[s since `before`, runnable tasks, busy fraction, steal fraction], ...]: each
    sample's runnable count and the CPU fractions over the interval that ended at it;
    `runnable_median`, `busy_median`, `steal_median` their medians (None without samples).
    The 1-minute load average lags a window of a minute by most of it: the samples do not.
    """
    whole = _fractions(before, after)
    out = {"cpu_busy": whole["busy"], "cpu_steal": whole["steal"], "cpu_iowait": whole["iowait"],
           "loadavg_1m_start": before["loadavg_1m"], "loadavg_1m_end": after["loadavg_1m"],
           "cpus": after.get("cpus")}
    points = [before, *(during or []), after]
    rows = []
    for prev, cur in zip(points, points[1:]):
        f = _fractions(prev, cur)
        rows.append([round(cur.get("t", 0.0) - before.get("t", 0.0), 3), cur.get("runnable"), f["busy"], f["steal"]])
    rows = rows if during else []
    out["samples"] = rows
    for i, name in ((1, "runnable_median"), (2, "busy_median"), (3, "steal_median")):
        values = [r[i] for r in rows if r[i] is not None]
        out[name] = float(statistics.median(values)) if values else None
    return out


# -- the emulators ----------------------------------------------------------------------------

def emulator_window(before: dict, after: dict) -> dict:
    """The emulators' lateness and NFQUEUE drops between two snapshots.

    Parameters
    ----------
    before, after : dict
        Emulator name -> its statistics snapshot (qos.emulator's JSON: `lateness_counts`,
        `lateness_max_s`, `directions[...]["kernel_queue"]`). An emulator restarted in
        between (its counts went down) counts from its restart.

    Returns
    -------
    dict
        `lateness_s`: {p50, p99, max, packets} over all emulators; `by_emulator`: the same per
        emulator; `nfqueue_drops`: {emulator: {queue: {queue_dropped, user_dropped}}} and
        `nfqueue_drops_total`.
    """
    total = [0] * (len(LATENESS_EDGES_S) + 1)
    by_emulator, drops, drop_total = {}, {}, 0
    for name, snap in after.items():
        old = before.get(name) or {}
        counts = snap.get("lateness_counts") or []
        base = old.get("lateness_counts") or [0] * len(counts)
        if len(base) != len(counts) or any(a < b for a, b in zip(counts, base)):
            base = [0] * len(counts)  # restarted in between
        window = [a - b for a, b in zip(counts, base)]
        total = [t + w for t, w in zip(total, window)] if window else total
        by_emulator[name] = _lateness(window)
        drops[name] = {}
        old_dirs = old.get("directions", {})
        for dname, d in snap.get("directions", {}).items():
            k, k0 = d.get("kernel_queue") or {}, (old_dirs.get(dname) or {}).get("kernel_queue") or {}
            q = {f: max(0, k.get(f, 0) - k0.get(f, 0)) if k.get(f, 0) >= k0.get(f, 0) else k.get(f, 0)
                 for f in ("queue_dropped", "user_dropped")}
            drops[name][str(d.get("queue", dname))] = q
            drop_total += q["queue_dropped"] + q["user_dropped"]
    return {"lateness_s": _lateness(total), "by_emulator": by_emulator, "nfqueue_drops": drops,
            "nfqueue_drops_total": drop_total}


def _lateness(counts: list[int]) -> dict:
    q = histogram_quantiles(counts) if counts else {0.5: None, 0.99: None, 1.0: None}
    return {"p50": q[0.5], "p99": q[0.99], "max": q[1.0], "packets": int(sum(counts))}


# -- the verdict ------------------------------------------------------------------------------

def judge(fidelity: dict, bound: FidelityBound = DEFAULT_BOUND) -> tuple[bool, list[str]]:
    """Whether a run's emulators and machine kept to `bound`; (valid, reason codes when not).

    A run without emulators (kernel queues only) or whose emulators released no packet is
    judged on its machine (and settling) alone. Codes: "lateness_p99", "lateness_max",
    "nfqueue_drops"; "load" (runnable median above the bound), "steal"; "unsettled" (the
    competing traffic had not reached its rate when the case began: `settle`).
    """
    late = (fidelity.get("emulator") or {}).get("lateness_s") or {}
    reasons = []
    if late.get("p99") is not None and late["p99"] > bound.p99_lateness_s:
        reasons.append("lateness_p99")
    if late.get("max") is not None and late["max"] > bound.max_lateness_s:
        reasons.append("lateness_max")
    if (fidelity.get("emulator") or {}).get("nfqueue_drops_total", 0) > bound.nfqueue_drops:
        reasons.append("nfqueue_drops")
    machine = fidelity.get("machine") or {}
    for key, code in (("runnable_median", "load"), ("steal_median", "steal")):
        limit = getattr(bound, key)
        if limit is not None and machine.get(key) is not None and machine[key] > limit:
            reasons.append(code)
    if (fidelity.get("settle") or {}).get("settled") is False:
        reasons.append("unsettled")
    return not reasons, reasons


def fidelity_record(machine_before: dict, machine_after: dict, emulators_before: dict, emulators_after: dict,
                    bound: FidelityBound = DEFAULT_BOUND, machine_during: list[dict] | None = None,
                    settle: dict | None = None) -> dict:
    """A run's `fidelity` block: machine (with its samples `machine_during` the window) and
    emulator windows, how the competing traffic settled before it (`settle`), the bound, and
    the verdict."""
    record = {"machine": machine_window(machine_before, machine_after, machine_during),
              "emulator": emulator_window(emulators_before, emulators_after) if emulators_after else None,
              "settle": settle, "bound": asdict(bound)}
    valid, reasons = judge(record, bound)
    return record | {"valid": valid, "invalid_reasons": reasons}


def measured(source, measure: Callable[[], T], bound: FidelityBound = DEFAULT_BOUND,
             attempts: int = 1, usable: Callable[[T], bool] = lambda result: True) -> tuple[T, dict]:
    """`measure()`'s result and the fidelity record of its window, measured again while the
    window is invalid (`judge`) or the result itself says the machine interfered (`usable`
    false: e.g. a traffic sender that stalled and caught up in a burst), at most `attempts`
    times in all; the last attempt's.

    `source` is anything with the testbed's `emulator_snapshots` (a Testbed, a bench); its
    emulators and the machine are sampled before `measure` and after it (the emulators' first
    snapshots written after it ended).
    """
    for _ in range(attempts):
        emulators_before, machine_before = source.emulator_snapshots(), machine_sample()
        result = measure()
        machine_after = machine_sample()
        emulators_after = source.emulator_snapshots(newer_than=time.time())
        record = fidelity_record(machine_before, machine_after, emulators_before, emulators_after, bound)
        if record["valid"] and usable(result):
            break
    return result, record
