"""Each run records and judges its own fidelity; one experiment holds the machine; runs go in
randomised rounds. Fakes only (no root): the real emulator's side is tests/qos/test_emulator_fidelity.py."""

from __future__ import annotations

import collections

import pytest

from qos.emulator.stats import LATENESS_EDGES_S, histogram_quantiles, lateness_bin
from qos.experiment import fidelity, runner
from qos.experiment.matrix import expand
from qos.experiment.runner import run_experiment
from qos.experiment.spec import parse_spec
from qos.experiment.store import Store

SPEC = {
    "experiment": {"name": "t", "repetitions": 3, "seed": 11, "settle_s": 0.0, "settle_fraction": 0.0,
                   "order": "rounds"},
    "competing": {"levels": [0, 2, 4, 8]},
    "strategies": {"fifo": {"discipline": "fifo"}, "prio": {"discipline": "prio"}, "wfq": {"discipline": "wfq"}},
    "links": [{"name": "a", "core_kbit": 1000}],
}


def _snapshot(late_s: list[float], base: dict | None = None, queue_dropped: int = 0) -> dict:
    counts = list((base or {}).get("lateness_counts") or [0] * (len(LATENESS_EDGES_S) + 1))
    for x in late_s:
        counts[lateness_bin(x)] += 1
    return {"lateness_counts": counts, "lateness_max_s": max(late_s, default=0.0), "written_unix_s": 1e12,
            "directions": {"rA": {"queue": 0, "kernel_queue": {"queue_dropped": queue_dropped, "user_dropped": 0}}}}


# -- the lateness histogram and the verdict ----------------------------------------------------

def test_histogram_quantiles_bracket_the_true_values():
    rng = __import__("numpy").random.default_rng(3)
    late = rng.lognormal(mean=-9, sigma=1.0, size=5000)  # ~0.1 ms
    counts = [0] * (len(LATENESS_EDGES_S) + 1)
    for x in late:
        counts[lateness_bin(x)] += 1
    q = histogram_quantiles(counts)
    import numpy as np

    for level, true in ((0.5, np.quantile(late, 0.5)), (0.99, np.quantile(late, 0.99)), (1.0, late.max())):
        assert true <= q[level] <= true * 10 ** 0.1 * 1.0001  # the bin's upper edge: within one bin


def test_window_counts_only_the_packets_between_two_snapshots():
    before = _snapshot([1e-5] * 100)
    after = _snapshot([0.05] * 10, base=before, queue_dropped=3)
    window = fidelity.emulator_window({"core": before}, {"core": after})
    assert window["lateness_s"]["packets"] == 10
    assert 0.05 <= window["lateness_s"]["p50"] < 0.07
    assert window["nfqueue_drops_total"] == 3


def test_an_emulator_restart_counts_from_the_restart():
    before = _snapshot([1e-5] * 100)
    after = _snapshot([1e-4] * 5)  # fewer counts than before: a new process
    window = fidelity.emulator_window({"core": before}, {"core": after})
    assert window["lateness_s"]["packets"] == 5


@pytest.mark.parametrize("late, codes", [
    ([1e-5] * 99, []),
    ([1e-5] * 50 + [5e-3] * 50, ["lateness_p99"]),
    ([1e-5] * 999 + [0.5], ["lateness_max"]),
])
def test_judge_marks_an_emulator_that_fell_behind(late, codes):
    record = fidelity.fidelity_record(fidelity.machine_sample(), fidelity.machine_sample(),
                                      {"core": _snapshot([])}, {"core": _snapshot(late)})
    assert record["valid"] is (not codes)
    assert record["invalid_reasons"] == codes


def test_nfqueue_drops_make_a_run_invalid():
    record = fidelity.fidelity_record(fidelity.machine_sample(), fidelity.machine_sample(),
                                      {"core": _snapshot([])}, {"core": _snapshot([1e-5], queue_dropped=1)})
    assert record["invalid_reasons"] == ["nfqueue_drops"]


def test_measured_judges_the_window_of_what_it_measures():
    class Snapshots:  # emulator snapshots as a Testbed gives them: cumulative
        snap = _snapshot([1e-5] * 1000)  # a late past that is not the window's

        def emulator_snapshots(self, newer_than=0.0):
            return {"core": self.snap}

    source = Snapshots()

    def measure(late_s):
        source.snap = _snapshot([late_s] * 100, base=source.snap)
        return "result"

    result, record = fidelity.measured(source, lambda: measure(1e-5))
    assert result == "result" and record["valid"] and record["emulator"]["lateness_s"]["packets"] == 100
    _, record = fidelity.measured(source, lambda: measure(5e-3))
    assert record["invalid_reasons"] == ["lateness_p99"] and record["emulator"]["lateness_s"]["packets"] == 100
    # Measured again while invalid, at most `attempts` times: the last attempt's record.
    lateness = [5e-3, 1e-5, 5e-3]
    _, record = fidelity.measured(source, lambda: measure(lateness.pop(0)), attempts=3)
    assert record["valid"] and lateness == [5e-3]
    lateness = [5e-3, 5e-3, 1e-5]
    _, record = fidelity.measured(source, lambda: measure(lateness.pop(0)), attempts=2)
    assert not record["valid"] and lateness == [1e-5]
    # ... or while the result says the machine interfered (usable false), on a valid window.
    results = ["stalled", "paced", "stalled"]
    result, record = fidelity.measured(source, lambda: (measure(1e-5), results.pop(0))[1], attempts=3,
                                       usable=lambda r: r == "paced")
    assert result == "paced" and record["valid"] and results == ["stalled"]


def test_machine_window_reads_busy_and_steal(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\n")
    before = {"cpu": fidelity.cpu_times(stat), "loadavg_1m": 1.0, "cpus": 2}
    stat.write_text("cpu  200 0 100 900 10 0 0 90 0 0\n")  # +100 user +50 sys +100 idle +50 steal
    after = {"cpu": fidelity.cpu_times(stat), "loadavg_1m": 3.0, "cpus": 2}
    w = fidelity.machine_window(before, after)
    assert w["cpu_busy"] == pytest.approx(200 / 300)
    assert w["cpu_steal"] == pytest.approx(50 / 300)
    assert (w["loadavg_1m_start"], w["loadavg_1m_end"]) == (1.0, 3.0)


def _sample(t: float, busy: int, idle: int, steal: int, runnable: int) -> dict:
    return {"t": t, "cpu": {"user": busy, "nice": 0, "system": 0, "idle": idle, "iowait": 0, "irq": 0,
                            "softirq": 0, "steal": steal}, "runnable": runnable, "loadavg_1m": 0.5, "cpus": 2}


def test_the_machine_is_judged_by_the_medians_of_its_samples_during_the_window():
    before = _sample(0.0, 0, 0, 0, 1)
    # every half second: +50 busy +50 idle; the runnable count high in 2 of 5 samples only
    during = [_sample(0.5 * i, 50 * i, 50 * i, 0, r) for i, r in enumerate([2, 9, 2, 9, 3], start=1)]
    after = _sample(3.0, 300, 300, 0, 2)
    w = fidelity.machine_window(before, after, during)
    assert w["runnable_median"] == 2.5 and w["busy_median"] == pytest.approx(0.5) and w["steal_median"] == 0
    assert len(w["samples"]) == 6 and w["samples"][1][:2] == [1.0, 9]
    two_cores = fidelity.FidelityBound(runnable_median=2.5, steal_median=0.05)  # as the contested file
    assert fidelity.judge({"machine": w}, two_cores) == (True, [])
    # most of the window crowded: the median passes the bound
    during = [_sample(0.5 * i, 50 * i, 50 * i, 0, r) for i, r in enumerate([9, 9, 2, 9, 9], start=1)]
    w = fidelity.machine_window(before, after, during)
    assert fidelity.judge({"machine": w}, two_cores) == (False, ["load"])
    # the hypervisor took a third of every interval
    during = [_sample(0.5 * i, 40 * i, 40 * i, 40 * i, 2) for i in range(1, 6)]
    w = fidelity.machine_window(before, _sample(3.0, 240, 240, 240, 2), during)
    assert w["steal_median"] == pytest.approx(1 / 3)
    assert fidelity.judge({"machine": w}, two_cores) == (False, ["steal"])
    assert fidelity.judge({"machine": w}) == (True, [])  # recorded, not judged by default
    # without samples (the ends only) the medians are not judged
    w = fidelity.machine_window(before, after)
    assert w["runnable_median"] is None and fidelity.judge({"machine": w}, two_cores) == (True, [])


def test_a_run_whose_traffic_had_not_settled_is_invalid():
    assert fidelity.judge({"settle": {"settled": False, "waited_s": 20.0}}) == (False, ["unsettled"])
    assert fidelity.judge({"settle": {"settled": True, "waited_s": 2.0}}) == (True, [])
    assert fidelity.judge({"settle": None}) == (True, [])


class _Ramp:
    """Competing traffic on a fake clock: `slow_kbit` until `until_s`, then `fast_kbit`."""

    def __init__(self, slow_kbit: float, fast_kbit: float, until_s: float):
        self.now, self.slow, self.fast, self.until = 0.0, slow_kbit, fast_kbit, until_s

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def competing_bytes(self) -> int:
        t = self.now
        kbit = self.slow * min(t, self.until) + self.fast * max(0.0, t - self.until)
        return int(kbit * 1000 / 8)


def test_settling_waits_until_the_last_second_reaches_the_target():
    ramp = _Ramp(2000, 9000, until_s=3.0)
    got = runner.settle_competing(ramp, 6000, limit_s=20, clock=ramp.clock, sleep=ramp.sleep)
    assert got["settled"] and 3.0 < got["waited_s"] <= 4.0 + runner.SETTLE_POLL_S
    assert got["rate_kbit"] >= 6000
    ramp = _Ramp(2000, 2000, until_s=0.0)  # never there: bounded, and says so
    got = runner.settle_competing(ramp, 6000, limit_s=5, clock=ramp.clock, sleep=ramp.sleep)
    assert not got["settled"] and 5.0 <= got["waited_s"] < 5.0 + 2 * runner.SETTLE_POLL_S
    assert got["rate_kbit"] == pytest.approx(2000, rel=0.01)


def test_settling_also_waits_for_the_emulators_to_keep_time():
    ramp = _Ramp(9000, 9000, until_s=0.0)  # the traffic at its rate at once; an emulator late at first
    late = {"snap": _snapshot([])}

    def snapshots(newer_than=0.0):
        late["snap"] = _snapshot([5e-3 if ramp.now < 3.0 else 1e-5] * 100, base=late["snap"])
        return {"core": late["snap"]}

    ramp.emulator_snapshots = snapshots
    got = runner.settle_competing(ramp, 6000, limit_s=20, p99_bound_s=fidelity.P99_BOUND_S,
                                  clock=ramp.clock, sleep=ramp.sleep)
    assert got["settled"] and got["emulator_steady"] and got["waited_s"] > 3.0
    assert got["emulator_p99_s"] <= fidelity.P99_BOUND_S
    # an emulator late throughout: the wait is bounded, and the traffic's rate still settles the run
    got = runner.settle_competing(ramp, 6000, limit_s=2, p99_bound_s=1e-6, clock=ramp.clock, sleep=ramp.sleep)
    assert got["settled"] and not got["emulator_steady"] and 2.0 <= got["waited_s"] < 2.0 + 2 * runner.SETTLE_POLL_S
    got = runner.settle_competing(ramp, 6000, limit_s=20, clock=ramp.clock, sleep=ramp.sleep)
    assert got["settled"] and got["waited_s"] <= 1.0 + runner.SETTLE_POLL_S  # the rate alone


def test_the_path_rate_is_the_least_of_link_medium_and_shaping():
    exp = parse_spec({**SPEC, "strategies": {"fifo": {"discipline": "fifo"},
                                             "shape": {"discipline": "wfq", "shape_kbit": 200}}})
    link = exp.link("a")
    assert runner.path_rate_kbit(link, exp.strategy("fifo")) == 1000
    assert runner.path_rate_kbit(link, exp.strategy("shape")) == 200


def test_an_unsettled_run_is_run_again_and_its_attempts_say_why(tmp_path):
    exp = parse_spec({**SPEC, "experiment": {**SPEC["experiment"], "repetitions": 1, "settle_fraction": 0.5,
                                             "settle_limit_s": 0.3}, "competing": {"levels": [4]},
                      "strategies": {"fifo": {"discipline": "fifo"}}})
    store = run_experiment(exp, tmp_path / "out", _StarvedBench([1e-5] * 3), progress=False, allow_dirty=True)
    (record,) = store.load_runs()
    assert record["attempt"] == fidelity.MAX_ATTEMPTS and not record["fidelity"]["valid"]
    assert [a["reasons"] for a in record["invalid_attempts"]] == [["unsettled"]] * (fidelity.MAX_ATTEMPTS - 1)
    assert record["fidelity"]["settle"]["settled"] is False and record["fidelity"]["settle"]["target_kbit"] == 500
    assert store.metadata()["sessions"][-1]["invalid"] == 1


# -- the invalid-run rule in the runner --------------------------------------------------------

class _StarvedBench:
    """A bench whose emulator is late by `lateness[i]` seconds on every packet of attempt i."""

    def __init__(self, lateness: list[float]):
        self.lateness = list(lateness)
        self.snap = _snapshot([])
        self.cases = 0

    def environment(self):
        return {"bench": "fake"}

    def configure(self, link, strategy):
        pass

    def set_competing(self, level, seed):
        return None

    def stop_competing(self):
        return None

    def finish(self):
        return {}

    def counters(self):
        return {}

    def competing_bytes(self):
        return 0

    def behind_core(self, site):
        return True

    def emulator_snapshots(self, newer_than=0.0):
        return {"core": self.snap}

    def run_case(self, request_class, seed, case_id):
        late = self.lateness.pop(0) if self.lateness else 1e-5
        self.snap = _snapshot([late] * 200, base=self.snap)
        self.cases += 1
        site = {"site": "B1", "bytes_up": 1000, "bytes_down": 1000, "compute_s": 0.0}
        return {"ok": True, "completion_s": 1.0, "sites": [site], "bytes_up": 1000, "bytes_down": 1000}


def _one_run_spec():
    return parse_spec({**SPEC, "experiment": {**SPEC["experiment"], "repetitions": 1},
                       "competing": {"levels": [0]}, "strategies": {"fifo": {"discipline": "fifo"}}})


def test_a_starved_run_is_marked_and_run_again(tmp_path):
    bench = _StarvedBench([0.02, 1e-5])  # first attempt 20 ms late on every packet, then on time
    store = run_experiment(_one_run_spec(), tmp_path / "out", bench, progress=False, allow_dirty=True)
    (record,) = store.load_runs()
    assert bench.cases == 2 and record["attempt"] == 2 and record["fidelity"]["valid"]
    assert record["invalid_attempts"][0]["reasons"] == ["lateness_p99"]
    assert len(list((tmp_path / "out" / "invalid").glob("*.json"))) == 1
    session = store.metadata()["sessions"][-1]
    assert (session["invalid"], session["reruns"]) == (0, 1)


def test_re_runs_are_bounded_and_the_last_attempt_stays_marked(tmp_path):
    bench = _StarvedBench([0.02] * 10)
    store = run_experiment(_one_run_spec(), tmp_path / "out", bench, progress=False, allow_dirty=True,
                           max_attempts=3)
    (record,) = store.load_runs()
    assert bench.cases == 3 and record["attempt"] == 3 and not record["fidelity"]["valid"]
    session = store.metadata()["sessions"][-1]
    assert (session["invalid"], session["reruns"]) == (1, 2)


def test_the_report_keeps_invalid_runs_apart(tmp_path):
    from qos.experiment.cells import load_cells

    bench = _StarvedBench([0.02] * 10)
    run_experiment(_one_run_spec(), tmp_path / "out", bench, progress=False, allow_dirty=True, max_attempts=1)
    _, cells = load_cells(tmp_path / "out")
    (cell,) = cells.values()
    assert cell.times == [] and cell.invalid == 1


# -- the randomised order ----------------------------------------------------------------------

def test_rounds_visit_every_level_once_per_repetition_in_a_seeded_order():
    exp = parse_spec(SPEC)
    runs = expand(exp)
    assert [r.run_id for r in expand(exp)] == [r.run_id for r in runs]  # reproducible from the seed
    per_round = 4 * 3
    orders = []
    for rep in range(3):
        block = runs[rep * per_round:(rep + 1) * per_round]
        assert {r.repetition for r in block} == {rep}
        levels = [r.competing for r in block]
        assert sum(1 for a, b in zip(levels, levels[1:]) if a != b) == 3  # one block per level
        orders.append(list(dict.fromkeys(levels)))
    assert len({tuple(o) for o in orders}) > 1  # levels in a new order in some round
    firsts = collections.Counter(runs[i].strategy for i in range(0, len(runs), 3))
    assert len(firsts) > 1  # strategies shuffled within blocks
    other = parse_spec({**SPEC, "experiment": {**SPEC["experiment"], "seed": 12}})
    assert [r.run_id for r in expand(other)] != [r.run_id for r in runs]


def test_each_raw_record_says_its_place_in_the_order(tmp_path):
    exp = parse_spec({**SPEC, "experiment": {**SPEC["experiment"], "repetitions": 1},
                      "competing": {"levels": [0, 2]}})
    store = run_experiment(exp, tmp_path / "out", _StarvedBench([]), progress=False, allow_dirty=True)
    records = sorted(store.load_runs(), key=lambda r: r["order"]["position"])
    assert [r["run"]["run_id"] for r in records] == store.metadata()["order"]
    assert {(r["order"]["kind"], r["order"]["seed"]) for r in records} == {("rounds", 11)}
