"""Findings declared in the experiment file: each a test, Holm-adjusted together."""

import numpy as np
import pytest
from scipy import stats as sps

from pathmaster.records import InvalidInput
from qos.experiment.findings import Finding, evaluate, holm
from qos.experiment.spec import parse_spec

BASE = {
    "experiment": {"name": "t"},
    "competing": {"levels": [0, 16]},
    "strategies": {"fifo": {"discipline": "fifo"}, "prio": {"discipline": "prio"}},
    "links": [{"name": "l", "core_kbit": 10_000}],
}


def finding(**kw) -> Finding:
    return Finding(**{"name": "f", "claim": "less", "a": {"strategy": "prio", "level": 16},
                      "b": {"strategy": "fifo", "level": 16}, **kw})


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04 -> x3, x2, x1 = 0.03, 0.04, 0.04 (monotone), back in input order
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_a_clear_difference_is_reproduced_with_the_p_and_effect():
    rng = np.random.default_rng(0)
    fast, slow = rng.normal(1.0, 0.1, 10), rng.normal(2.0, 0.5, 10)
    [row] = evaluate([finding()], [(fast, slow)])
    assert row["verdict"] == "reproduced"
    assert row["p"] == pytest.approx(sps.ttest_ind(fast, slow, equal_var=False, alternative="less").pvalue)
    assert row["effect_s"] == pytest.approx(fast.mean() - slow.mean())


def test_the_opposite_is_not_reproduced_and_noise_is_not_resolvable():
    rng = np.random.default_rng(1)
    fast, slow = rng.normal(1.0, 0.1, 10), rng.normal(2.0, 0.1, 10)
    same1, same2 = rng.normal(1.0, 0.3, 10), rng.normal(1.0, 0.3, 10)
    rows = evaluate([finding(name="wrong way"), finding(name="noise")], [(slow, fast), (same1, same2)])
    assert [r["verdict"] for r in rows] == ["not reproduced", "not resolvable at n = 10"]


def test_holm_makes_a_marginal_result_unresolvable():
    """p = 0.02 alone is a finding (Holm over it and its opposite: 0.04); among four claims it is not."""
    a = np.array([0.9, 1.0, 1.1, 1.0, 0.95, 1.05, 1.0, 0.9, 1.1, 1.0])
    b = a + 0.07
    alone = evaluate([finding()], [(a, b)])[0]
    assert alone["p"] == pytest.approx(0.020, abs=0.001) and alone["p_holm"] == pytest.approx(2 * alone["p"])
    assert alone["verdict"] == "reproduced"
    same = [(a, a + 0.001 * i) for i in range(3)]
    crowd = evaluate([finding(name=str(i)) for i in range(4)], [(a, b)] + same)[0]
    assert crowd["p"] == pytest.approx(alone["p"]) and crowd["p_holm"] > 0.05
    assert crowd["verdict"].startswith("not resolvable")


def test_alike_is_an_equivalence_test_and_other_statistics_are_permutation_tests():
    rng = np.random.default_rng(2)
    a, b = rng.normal(1.0, 0.05, 10), rng.normal(1.0, 0.05, 10)
    alike = finding(claim="alike", margin=0.25)
    far = rng.normal(2.0, 0.05, 10)
    rows = evaluate([alike, alike], [(a, b), (far, b)])
    assert [r["verdict"] for r in rows] == ["reproduced", "not reproduced"]
    spread = finding(statistic="std")
    narrow, wide = rng.normal(1.0, 0.05, 10), rng.normal(1.0, 1.0, 10)
    [row] = evaluate([spread], [(narrow, wide)])
    assert row["verdict"] == "reproduced" and row["a"] < row["b"]


def test_too_few_runs_are_not_resolvable():
    [row] = evaluate([finding()], [([1.0], [2.0, 3.0])])
    assert row["verdict"] == "not resolvable at n = 1"


def test_the_experiment_file_declares_them_and_they_are_checked():
    exp = parse_spec({**BASE, "findings": [{"name": "pq beats fifo", "claim": "less",
                                            "a": {"strategy": "prio", "level": 16},
                                            "b": {"strategy": "fifo", "level": 16}}]})
    assert exp.findings[0].a.strategy == "prio" and exp.to_dict()["findings"][0]["claim"] == "less"
    for bad, words in [({"strategy": "wfq", "level": 16}, "no strategy 'wfq'"),
                       ({"strategy": "prio", "level": 8}, "level 8 is not one of"),
                       ]:
        with pytest.raises(InvalidInput, match=words):
            parse_spec({**BASE, "findings": [{"name": "x", "claim": "less", "a": bad,
                                              "b": {"strategy": "fifo", "level": 16}}]})
    with pytest.raises(InvalidInput, match="margin"):
        parse_spec({**BASE, "findings": [{"name": "x", "claim": "alike", "a": {"strategy": "prio", "level": 0},
                                          "b": {"strategy": "fifo", "level": 0}}]})
    assert "findings" not in parse_spec(BASE).to_dict()  # older experiments keep their fingerprint


def test_the_report_tests_the_declared_findings_on_their_cells():
    from qos.experiment.cells import Cell, declared_findings

    meta = {"seed": 3, "experiment": {"links": [{"name": "l"}], "request_classes": ["urgent"], "findings": [
        {"name": "pq beats fifo", "claim": "less", "statistic": "mean",
         "a": {"strategy": "prio", "level": 16}, "b": {"strategy": "fifo", "level": 16}},
        {"name": "alike idle", "claim": "alike", "statistic": "median", "margin": 0.25,
         "a": {"strategy": "prio", "level": 0}, "b": {"strategy": "fifo", "level": 0}}]}}
    rng = np.random.default_rng(4)
    cells = {}
    for strategy, level, mean in (("prio", 16, 1.0), ("fifo", 16, 3.0), ("prio", 0, 1.0), ("fifo", 0, 1.0)):
        cell = Cell(strategy, float(level), "l", "urgent")
        cell.times = list(rng.normal(mean, 0.05, 10))
        cells[cell.key] = cell
    rows = declared_findings(meta, cells)
    assert [r["verdict"] for r in rows] == ["reproduced", "reproduced"]
    assert rows[0]["effect_s"] == pytest.approx(-2.0, abs=0.1)


def test_brown_forsythe_one_sided_is_levene_median_halved():
    from qos.experiment.findings import brown_forsythe_less_p

    rng = np.random.default_rng(5)
    narrow, wide = rng.normal(10, 1, 10), rng.normal(10, 3, 12)
    two_sided = sps.levene(narrow, wide, center="median").pvalue
    one = brown_forsythe_less_p(narrow, wide)
    assert one < 0.5 and 2 * one == pytest.approx(two_sided)
    assert brown_forsythe_less_p(wide, narrow) == pytest.approx(1 - one)


def test_spread_is_not_fooled_by_a_shift_of_the_mean():
    rng = np.random.default_rng(6)
    a = rng.normal(10, 1, 10)
    [row] = evaluate([finding(statistic="spread")], [(a, a + 50)])  # same spread, far apart
    assert row["verdict"].startswith("not resolvable")


def test_against_several_cells_the_claim_must_hold_against_each():
    from qos.experiment.findings import Pair

    rng = np.random.default_rng(7)
    fast = rng.normal(1.0, 0.1, 10)
    slow, slower, same = rng.normal(2.0, 0.1, 10), rng.normal(3.0, 0.1, 10), rng.normal(1.0, 0.1, 10)
    f = finding(b=[{"strategy": "fifo", "level": 16}, {"strategy": "wfq", "level": 16}])
    beats_both = evaluate([f], [[Pair(fast, slow), Pair(fast, slower)]])[0]
    assert beats_both["verdict"] == "reproduced"
    one_tie = evaluate([f], [[Pair(fast, slow), Pair(fast, same)]])[0]
    assert one_tie["verdict"].startswith("not resolvable") and one_tie["versus"] == "wfq@16"
    assert one_tie["p"] == pytest.approx(sps.ttest_ind(fast, same, equal_var=False, alternative="less").pvalue)


def test_a_change_of_means_is_welch_on_the_difference_of_differences():
    from qos.experiment.findings import Pair, change_less_p

    rng = np.random.default_rng(8)
    idle = rng.normal(20, 0.5, 10)
    grows_a_lot, grows_little = rng.normal(80, 3, 10), rng.normal(40, 3, 10)
    f = finding(claim="greater", change_from=0)
    [row] = evaluate([f], [[Pair(grows_a_lot, grows_little, idle, idle.copy())]])
    assert row["verdict"] == "reproduced" and row["a"] == pytest.approx(grows_a_lot.mean() - idle.mean())
    # with equal base cells the test is Welch's on the loaded cells' means, up to the extra variance
    p = change_less_p(Pair(grows_little, grows_a_lot, idle, idle))
    assert p < 1e-6


def test_one_verdict_per_study_finding():
    from qos.experiment.findings import study_verdicts

    rows = [{"study": "2", "finding": "2a. x", "verdict": "reproduced"},
            {"study": "2", "finding": "2b. y", "verdict": "not reproduced"},
            {"study": "3", "finding": "3a. x", "verdict": "reproduced"},
            {"study": "3", "finding": "3b. y", "verdict": "not resolvable at n = 10"},
            {"study": "6", "finding": "6. z", "verdict": "reproduced"}]
    assert {r["study"]: r["verdict"] for r in study_verdicts(rows)} == {
        "2": "not reproduced", "3": "not resolvable", "6": "reproduced"}
    assert finding(name="2b. FIFO has the largest spread").group == "2"


def test_the_faithful_experiment_states_the_findings_as_the_study_does():
    from qos.experiment.spec import load_spec

    exp = load_spec("pathmaster2002-faithful")
    by_group: dict = {}
    for f in exp.findings:
        by_group.setdefault(f.group, []).append(f)
    assert sorted(by_group) == ["1", "2", "3", "4", "5", "6"]
    loaded = sorted(level for level in exp.competing.levels if level > 0)
    (one,) = by_group["1"]
    assert one.a.level == loaded[0] and one.margin == 0.10  # the lowest loaded level
    assert {f.statistic for f in by_group["2"]} == {"mean", "spread"}
    assert all(f.a.strategy == "fifo" and len(f.others) == 4 for f in by_group["2"])
