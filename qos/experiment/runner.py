"""Run an experiment: every run of its matrix, in shuffled order, resumable, with a progress bar.

    experiment = load_spec("smoke")
    with TestbedBench(experiment) as bench:
        run_experiment(experiment, "out/smoke", bench)

The runner owns the order and the record; the bench (see bench.py) owns the network: it
sets a link and a router strategy, keeps the competing traffic at a level, runs one
case and reads the counters. The runner changes only what differs from the previous
run, so competing traffic stays warm across a block of runs at the same level.

An interrupted experiment (Ctrl-C, a crash, a reboot) resumes with the same command: runs
whose raw files exist are skipped, the rest go in the original order.

iperf3 reports a flow only when it stops, i.e. at the end of a block of runs at one level.
Then every run of the block gets its own iperf3 file (store.save_iperf3): the flows' JSON
with the per-second intervals that overlap its case. A crash (not Ctrl-C, which still stops
the traffic) loses the iperf3 files of the block it interrupts, not its runs.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Protocol

from tqdm import tqdm

from qos.experiment import fidelity
from qos.experiment.bound import SiteTransfer, lower_bound
from qos.experiment.matrix import Run, expand, remaining
from qos.experiment.spec import Experiment, LinkProfile, Strategy
from pathmaster.records import InvalidInput
from qos.experiment.store import Store, now_iso


class Bench(Protocol):
    """What the runner needs from a network (bench.TestbedBench is the real one)."""

    def environment(self) -> dict: ...
    def configure(self, link: LinkProfile, strategy: Strategy) -> None: ...
    def set_competing(self, level: float, seed: int): ...  # -> the stopped block's TrafficResult or None
    def stop_competing(self): ...  # -> TrafficResult or None
    def counters(self) -> dict: ...
    def competing_bytes(self) -> int: ...
    def run_case(self, request_class: str, seed: int, case_id: str) -> dict: ...
    def behind_core(self, site: str) -> bool: ...
    def emulator_snapshots(self, newer_than: float = 0.0) -> dict: ...  # {name: qos.emulator snapshot}
    def finish(self) -> dict: ...


def counter_delta(before: dict, after: dict) -> dict:
    """after - before for every numeric leaf of two nested counter dicts (gauges like backlog kept as after).

    Never negative: a counter that went down was reset in between (the emulator restarts with a
    new strategy, and until it writes its first statistics the file read "before" may be the old
    process's), so what it counts since the reset, `after`, is the delta, and the dict holding
    it gets "reset": True.
    """
    out = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = counter_delta(before.get(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("backlog", "qlen"):
            old = before.get(key, 0)
            if not isinstance(old, (int, float)) or value < old:
                out[key] = value
                out["reset"] = True
            else:
                out[key] = value - old
        else:
            out[key] = value
    return out


# After the competing traffic stops, how long its last packets may take to leave the queues
# (a PQ's low queue holds up to 80 packets behind a case): the runner waits, at most this
# long, until the competing targets' received bytes stop growing over QUIET_S.
DRAIN_LIMIT_S = 10.0
QUIET_S = 0.5


def drain_competing(bench: Bench, limit_s: float = DRAIN_LIMIT_S, quiet_s: float = QUIET_S) -> float:
    """Wait (at most `limit_s`) until the competing targets receive nothing for `quiet_s`; returns the wait (s).

    Without it the first case after a block of traffic counts that block's leftovers as
    competing traffic (a level-0 PQ run once showed 73 kB, "8.7 kbit/s", where none ran) and
    meets them in the queues."""
    t0 = time.monotonic()
    last = bench.competing_bytes()
    while time.monotonic() - t0 < limit_s:
        time.sleep(quiet_s)
        now = bench.competing_bytes()
        if now == last:
            break
        last = now
    return time.monotonic() - t0


def run_bound(experiment: Experiment, link: LinkProfile, sites: list[dict], bench: Bench) -> dict:
    """The physical lower bound of a finished case (bound.py) from its per-site bytes and work,
    and the master's work each site's request waited for (`prior_s`: the coordinator's analysis
    in features mode)."""
    transfers = [SiteTransfer(s["site"], s["bytes_up"], s["bytes_down"], s.get("compute_s", 0.0),
                              bench.behind_core(s["site"]), s.get("prior_s", 0.0)) for s in sites]
    return lower_bound(transfers, link.core_kbit, link.access_rate_kbit, link.delay_ms,
                       shared_medium=link.shared_medium).to_dict()


# How far a run's case window is widened when its intervals are picked: the epoch of a
# report's interval 0 is known to ~a millisecond (iperf3_origin); the slack keeps the
# intervals on either side of a short case.
IPERF3_SLACK_S = 2.0


def iperf3_origin(data: dict, stopped_epoch: float) -> float:
    """The epoch (s) at which an interrupted iperf3 report's interval 0 began: the moment
    its flows were stopped less the report's own duration. Without the stop time, iperf3's
    start stamp, which has whole seconds and precedes the streams' connections (on a busy
    machine by more than the slack)."""
    seconds = data.get("end", {}).get("sum_received", {}).get("seconds")
    if stopped_epoch and seconds:
        return stopped_epoch - seconds
    return data.get("start", {}).get("timestamp", {}).get("timesecs", 0)


def iperf3_of_run(result, window: tuple[float, float]) -> dict:
    """The competing flows' iperf3 JSON for one run: each report's `start` and `end` (which cover
    the whole block of traffic) and those per-second `intervals` (the last one partial) that
    overlap the run's case `window` (epoch seconds, widened by IPERF3_SLACK_S)."""
    flows: dict = {}
    for name, reports in result.iperf3.items():
        flows[name] = {}
        for side, data in reports.items():
            origin = iperf3_origin(data, getattr(result, "stopped_epoch", 0.0))
            lo, hi = window[0] - origin - IPERF3_SLACK_S, window[1] - origin + IPERF3_SLACK_S
            kept = [iv for iv in data.get("intervals", []) if iv["sum"]["end"] > lo and iv["sum"]["start"] < hi]
            flows[name][side] = data | {"intervals": kept}
    return {"case_window_epoch": list(window), "stopped_epoch": getattr(result, "stopped_epoch", 0.0),
            "flows": flows}


def save_block_iperf3(store: Store, result, block: list[tuple[str, tuple[float, float]]]) -> None:
    """Give every run of a stopped block of competing traffic its slice of the flows' iperf3 JSON."""
    if result is None or not result.iperf3:
        return
    runs = [run_id for run_id, _ in block]
    for run_id, window in block:
        store.save_iperf3(run_id, {"run_id": run_id, "kind": result.kind, "block_runs": runs,
                                   **iperf3_of_run(result, window)})


# Competing kinds whose rate is TCP's to find again after a queue changes (pareto's is its sender's).
TCP_KINDS = ("downloads", "wget")
SETTLE_WINDOW_S = 1.0   # the received rate that settles a level is measured over this last window
SETTLE_POLL_S = 0.25


def path_rate_kbit(link: LinkProfile, strategy: Strategy) -> float:
    """The rate the path allows the competing traffic: the core link's, a shared medium's, or
    the strategy's shaped rate, whichever is least."""
    rates = [link.core_kbit, link.access_rate_kbit if link.shared_medium else None, strategy.shape_kbit]
    return float(min(r for r in rates if r))


def settle_competing(bench: Bench, target_kbit: float, limit_s: float, p99_bound_s: float | None = None,
                     window_s: float = SETTLE_WINDOW_S, poll_s: float = SETTLE_POLL_S,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Wait until the testbed is steady, at most `limit_s`: the competing targets received at
    least `target_kbit` over the last `window_s`, and (with `p99_bound_s`) the emulators'
    99th-percentile release lateness over that window was within it.

    Returns {"settled" (the rate was reached: a run that never got there is invalid),
    "emulator_steady" (an emulator still late after `limit_s` is the whole case's lateness to
    judge), "waited_s", "rate_kbit" and "emulator_p99_s" (the last window's), "target_kbit"}. After a queue changes (a new strategy restarts the emulators; new competing
    processes) TCP's flows back off and take seconds to fill the path again (after host-side
    queues changed, 1.6-2.9 Mbit/s for 3 s against 8.9-9.3 later), and a restarted emulator
    meets their recovery burst: a case submitted before would meet less traffic than its
    level, or an emulator behind its bound. `clock` and `sleep` are the time's (tests give
    their own).
    """
    t0 = clock()
    points = [(0.0, bench.competing_bytes(), bench.emulator_snapshots() if p99_bound_s is not None else {})]
    rate, p99, steady = 0.0, None, p99_bound_s is None
    while True:
        sleep(poll_s)
        now = clock() - t0
        points.append((now, bench.competing_bytes(), bench.emulator_snapshots() if p99_bound_s is not None else {}))
        past = [p for p in points if p[0] <= now - window_s]
        if past:
            t_old, b_old, emulators_old = past[-1]
            rate = (points[-1][1] - b_old) * 8 / 1000 / (now - t_old)
            if points[-1][2]:
                p99 = fidelity.emulator_window(emulators_old, points[-1][2])["lateness_s"]["p99"]
            # no emulators (kernel queues): nothing to keep time; else a window of released packets
            steady = p99_bound_s is None or not points[-1][2] or (p99 is not None and p99 <= p99_bound_s)
            if rate >= target_kbit and steady:
                break
        if now >= limit_s:
            break
    return {"settled": rate >= target_kbit, "emulator_steady": steady, "waited_s": now, "rate_kbit": rate,
            "emulator_p99_s": p99, "target_kbit": target_kbit}


# How often the competing targets' received bytes and the machine are read during a case (the
# time series of the case against the competing traffic, plots.figure_timeseries; the
# machine's medians that judge the run, fidelity.machine_window).
SAMPLE_S = 0.5


class CompetingSampler:
    """Reads `bench.competing_bytes()` and the machine every `every_s` in a thread while a case runs.

    `samples` is [[t_s, bytes], ...]: seconds since the case started and the bytes the
    competing targets received since then (their interfaces' rx counters: every competing
    kind); `machine` the `fidelity.machine_sample`s. Bounded: it stops at `stop()` or after
    `limit_s`.
    """

    def __init__(self, bench: Bench, every_s: float = SAMPLE_S, limit_s: float = 3600.0):
        self.bench, self.every_s, self.limit_s = bench, every_s, limit_s
        self.samples: list[list[float]] = []
        self.machine: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="competing-sampler", daemon=True)

    def start(self, t0: float, base: int) -> None:
        self.t0, self.base = t0, base
        self.samples.append([0.0, 0])
        self._thread.start()

    def _read(self) -> None:
        try:
            self.machine.append(fidelity.machine_sample())
            total = self.bench.competing_bytes()
        except Exception:  # noqa: BLE001 - a missed sample must not fail the run
            return
        self.samples.append([time.monotonic() - self.t0, max(0, total - self.base)])

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s) and time.monotonic() - self.t0 < self.limit_s:
            self._read()

    def stop(self, final_bytes: int, final_t: float) -> list[list[float]]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.samples.append([final_t, max(0, final_bytes - self.base)])
        self.samples.sort()
        return self.samples


def execute_run(experiment: Experiment, run: Run, bench: Bench, state: dict) -> dict:
    """One run on the bench: configure what changed, time one case, return its raw record."""
    link = experiment.link(run.link)
    strategy = experiment.strategy(run.strategy)
    seed = run.seed(experiment.seed)
    # self-describing: which experiment (name, fingerprint of its configuration) and its workload
    recorded = experiment.to_dict()
    record: dict = {"seed": seed, "started": now_iso(),
                    "experiment": {"name": experiment.name, "fingerprint": experiment.fingerprint()},
                    "workload": recorded["workload"]}
    if state.get("config") != (link, strategy):
        bench.configure(link, strategy)
        state["config"] = (link, strategy)
        # A new discipline starts with empty queues: the competing flows lost what was queued
        # and back off, so they need to settle again before a case meets them at full strength.
        state["competing_since"] = time.monotonic()
    if state.get("competing") != run.competing:
        ended = bench.set_competing(run.competing, seed)
        state.setdefault("ended", []).append((ended, state.pop("block", [])))
        if not run.competing and state.get("competing"):
            record["drained_s"] = drain_competing(bench)
        state["competing"] = run.competing
        state["competing_since"] = time.monotonic()
    # The competing traffic needs time to reach its steady rate (TCP slow start) before a case.
    settle = None
    if run.competing:
        wait = experiment.settle_s - (time.monotonic() - state["competing_since"])
        if wait > 0:
            time.sleep(wait)
        if experiment.settle_fraction > 0 and experiment.competing.kind in TCP_KINDS:
            settle = settle_competing(bench, experiment.settle_fraction * path_rate_kbit(link, strategy),
                                      experiment.settle_limit_s,
                                      state.get("bound", fidelity.DEFAULT_BOUND).p99_lateness_s)
        settle = (settle or {}) | {"since_change_s": time.monotonic() - state["competing_since"]}
    emulators_before = bench.emulator_snapshots()
    machine_before = fidelity.machine_sample()
    counters_before = bench.counters()
    competing_before = bench.competing_bytes()
    sampler = CompetingSampler(bench, limit_s=experiment.workload.deadline_s + 60)
    t0, epoch0 = time.monotonic(), time.time()
    sampler.start(t0, competing_before)
    try:
        case = bench.run_case(run.request_class, seed, run.run_id)
    finally:
        window = time.monotonic() - t0
        competing_after = bench.competing_bytes()
        samples = sampler.stop(competing_after, window)
        machine_after = fidelity.machine_sample()
    if run.competing:
        state.setdefault("block", []).append((run.run_id, (epoch0, epoch0 + window)))
    record |= case
    # The emulators' snapshots written after the case ended count all of its packets.
    emulators_after = bench.emulator_snapshots(newer_than=epoch0 + window)
    record["fidelity"] = fidelity.fidelity_record(machine_before, machine_after, emulators_before, emulators_after,
                                                  state.get("bound", fidelity.DEFAULT_BOUND), sampler.machine, settle)
    record["router_counters"] = counter_delta(counters_before, bench.counters())
    record["competing"] = {
        "kind": experiment.competing.kind, "level": run.competing, "unit": experiment.competing.unit,
        "targets": list(experiment.competing.targets), "window_s": window,
        "bytes": competing_after - competing_before,
        "achieved_kbit": (competing_after - competing_before) * 8 / 1000 / window if window > 0 else 0.0,
        "samples": samples,  # [[s since the case started, bytes received since then], ...]
    }
    record["link"] = {"name": link.name, "network": link.network, "core_kbit": link.core_kbit,
                      "access_kbit": link.access_rate_kbit if link.shared_medium else None,
                      "delay_ms": link.delay_ms, "mtu": link.mtu,
                      "queue_packets": None if link.shared_medium else link.queue_packets}
    record["strategy"] = {"name": strategy.name, "discipline": strategy.discipline,
                          "shape_kbit": strategy.shape_kbit, "params": strategy.params,
                          "rto_min_ms": strategy.rto_min_ms,
                          "adaptive": strategy.adaptive.model_dump() if strategy.adaptive else None}
    if record.get("ok"):
        record["bound"] = run_bound(experiment, link, record["sites"], bench)
    record["finished"] = now_iso()
    return record


def run_valid(experiment: Experiment, run: Run, bench: Bench, state: dict, store: Store,
              max_attempts: int = fidelity.MAX_ATTEMPTS) -> dict:
    """Execute `run` until its fidelity is valid, at most `max_attempts` times; its last record,
    with `attempt` (1-based) and `invalid_attempts` (each invalid attempt's reasons)."""
    earlier: list[dict] = []
    for attempt in range(1, max_attempts + 1):
        record = execute_run(experiment, run, bench, state)
        record["attempt"] = attempt
        if record["fidelity"]["valid"] or attempt == max_attempts:
            record["invalid_attempts"] = earlier
            return record
        store.save_invalid(run, attempt, record)
        machine = record["fidelity"]["machine"]
        earlier.append({"attempt": attempt, "reasons": record["fidelity"]["invalid_reasons"],
                        "lateness_s": (record["fidelity"]["emulator"] or {}).get("lateness_s"),
                        "runnable_median": machine.get("runnable_median"),
                        "steal_median": machine.get("steal_median"), "settle": record["fidelity"].get("settle")})
    raise AssertionError("unreachable")  # the loop returns on its last attempt


def look_runs(experiment: Experiment, look: int) -> int:
    """Runs per cell at look `look` (1-based) of the experiment's `[sequential]` design."""
    design = experiment.sequential
    if design is None:
        raise InvalidInput(f"{experiment.name} declares no [sequential] looks", experiment.source)
    if not 1 <= look <= len(design.looks):
        raise InvalidInput(f"look {look}: {experiment.name} has looks 1-{len(design.looks)}", experiment.source)
    return design.looks[look - 1]


def _still_needed(experiment: Experiment, store: Store, run: Run, asked: dict) -> bool:
    """A `[sequential]` design's rule for `run` (sequential.needed: past the first look, with
    continue = "open", a cell whose findings a look resolved gets no more runs), read from the
    runs stored so far once per cell and look (`asked` keeps the answers: a look's verdicts
    change only when a look is reached, and the rounds reach it before its runs start)."""
    from qos.experiment import sequential  # here: a plain run reads no cells

    meta = {"experiment": experiment.to_dict()}
    look = sequential.deciding_look(meta["experiment"].get("sequential"), run.repetition)
    if look is None:
        return True
    if (run.cell, look) not in asked:
        from qos.experiment.cells import load_cells

        _, cells = load_cells(store.root)
        asked[run.cell, look] = sequential.needed(meta, cells, run.cell, run.repetition)
    return asked[run.cell, look]


def run_experiment(experiment: Experiment, out_dir: str | Path, bench: Bench, progress: bool = True,
                   max_runs: int | None = None, through_look: int | None = None, allow_dirty: bool = False,
                   allow_code_change: bool = False, bound: fidelity.FidelityBound | None = None,
                   max_attempts: int = fidelity.MAX_ATTEMPTS) -> Store:
    """Run (or resume) `experiment` into `out_dir` on `bench`; stop after `max_runs` new runs if
    given, and with a `[sequential]` design after look `through_look` (1-based: every cell at
    that look's runs). Past the first look, with continue = "open", the cells whose findings a
    look has resolved get no more runs (the session's metadata lists them).

    Refuses (InvalidInput) code with uncommitted changes unless `allow_dirty`, and a resume
    with other code than the start's unless `allow_code_change` (Store.open_for); the
    metadata records both.

    Each run's fidelity is judged against `bound` (default: the experiment's, its [fidelity]
    table or fidelity.DEFAULT_BOUND; fidelity.judge); an invalid run is run again,
    `max_attempts` in all: the invalid attempts are kept in OUT/invalid/, the last attempt in
    runs/ (with `fidelity.valid` false if none was valid), and each session in the metadata
    counts invalid runs and re-runs.

    Returns the store. At the end (also on interruption) the bench's `finish` stops the
    competing traffic, and what it reports (each competing block's totals) goes into the
    metadata. The bench stays up: its owner closes it.
    """
    bound = bound or experiment.fidelity_bound
    store = Store(out_dir)
    order = expand(experiment)
    store.open_for(experiment, order, allow_dirty=allow_dirty, allow_code_change=allow_code_change)
    todo = remaining(order, store.done_ids())
    if through_look is not None:
        todo = [run for run in todo if run.repetition < look_runs(experiment, through_look)]
    if max_runs is not None:
        todo = todo[:max_runs]
    session = len(store.metadata().get("sessions", [])) + 1  # each run says which session ran it
    state: dict = {"bound": bound}
    failures = invalid = reruns = not_needed = 0
    held_back: set[tuple] = set()  # cells whose findings a look resolved: no more runs
    asked: dict[tuple, bool] = {}  # (cell, look) -> still needed (_still_needed)
    started = time.monotonic()
    try:
        store.update_metadata(bench=bench.environment())
        bar = tqdm(todo, desc=experiment.name, unit="run", disable=not progress, file=sys.stderr,
                   initial=len(order) - len(remaining(order, store.done_ids())), total=len(order))
        position = {r.run_id: i for i, r in enumerate(order)}
        for run in bar:
            if run.cell in held_back or not _still_needed(experiment, store, run, asked):
                held_back.add(run.cell)
                not_needed += 1
                continue
            record = run_valid(experiment, run, bench, state, store, max_attempts)
            record["order"] = {"kind": experiment.order, "seed": experiment.seed, "position": position[run.run_id]}
            record["session"] = session
            failures += not record.get("ok")
            invalid += not record["fidelity"]["valid"]
            reruns += record["attempt"] - 1
            store.save_run(run, record)
            for ended, block in state.pop("ended", []):
                save_block_iperf3(store, ended, block)
            bar.set_postfix_str(f"{run.strategy} c={run.competing:g} {record.get('completion_s', 0):.2f}s"
                                + (f" failed={failures}" if failures else ""))
    finally:
        try:
            for ended, block in state.pop("ended", []):  # stopped by a run that did not finish
                save_block_iperf3(store, ended, block)
            save_block_iperf3(store, bench.stop_competing(), state.get("block", []))
        finally:
            closing = bench.finish() or {}
        meta = store.metadata()
        sessions = meta.get("sessions", [])
        sessions.append({"session": session, "runs": len(todo) - not_needed, "failed": failures, "invalid": invalid, "reruns": reruns,
                         "fidelity_bound": asdict(bound), "max_attempts": max_attempts,
                         "wall_s": time.monotonic() - started,
                         "ended": now_iso(), **closing})
        if held_back:
            sessions[-1]["resolved_cells"] = sorted("/".join(f"{part:g}" if isinstance(part, (int, float)) else part
                                                             for part in cell) for cell in held_back)
        fields = {"sessions": sessions}
        if not remaining(order, store.done_ids()):
            fields["finished"] = now_iso()
        store.update_metadata(**fields)
    return store
