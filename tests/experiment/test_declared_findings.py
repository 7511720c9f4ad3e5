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
    from qos.experiment.report import Cell, declared_findings

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
