"""Experiment files and their expansion into a shuffled, resumable run order."""

import collections

import pytest

from pathmaster.records import InvalidInput
from qos.experiment.matrix import expand, remaining
from qos.experiment.spec import builtin_names, load_spec, parse_spec

MINIMAL = {
    "experiment": {"name": "t", "repetitions": 4, "seed": 5},
    "competing": {"levels": [0, 3]},
    "strategies": {"fifo": {"discipline": "fifo"}, "s200": {"discipline": "wfq", "shape_kbit": 200}},
    "links": [{"name": "a", "core_kbit": 1000}, {"name": "b", "core_kbit": 2000, "delay_ms": 10}],
}


def test_every_builtin_experiment_loads():
    names = builtin_names()
    assert {"pathmaster2002", "wan-latency", "bursty", "smoke"} <= set(names)
    for name in names:
        exp = load_spec(name)
        assert exp.name == name
        assert expand(exp)


def test_pathmaster2002_is_the_study():
    exp = load_spec("pathmaster2002")
    assert exp.repetitions == 10
    assert {s.discipline for s in exp.strategies} == {"fifo", "prio", "wfq", "wred"}
    shapes = sorted(s.shape_kbit for s in exp.strategies if s.shape_kbit)
    assert shapes[0] == 200 and shapes[-1] == 4000
    assert exp.competing.targets == ("B3", "C3") and 0 in exp.competing.levels


def test_repetitions_default_to_ten():
    data = {**MINIMAL, "experiment": {"name": "t"}}
    assert parse_spec(data).repetitions == 10


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"strategies": {"x": {"discipline": "cbq"}}}, ["strategies.x", "cbq"]),
        ({"links": [{"name": "a"}]}, ["links[0]", "core_kbit"]),
        ({"competing": {"levels": [0, -1]}}, ["competing", "levels"]),
        ({"experiment": {"name": "t", "request_classes": ["vip"]}}, ["vip", "urgent"]),
        ({"experiment": {"name": "t", "repetitons": 3}}, ["unknown", "repetitons"]),
        ({"links": [{"name": "a", "core_kbit": "fast"}]}, ["core_kbit", "fast"]),
    ],
)
def test_bad_files_name_the_key_and_the_problem(patch, words):
    with pytest.raises(InvalidInput) as err:
        parse_spec({**MINIMAL, **patch}, source="bad.toml")
    message = str(err.value)
    assert message.startswith("bad.toml: ")
    for word in words:
        assert word in message


def test_missing_file_names_it_and_lists_builtins(tmp_path):
    with pytest.raises(InvalidInput) as err:
        load_spec(tmp_path / "nope.toml")
    assert "nope.toml" in str(err.value) and "smoke" in str(err.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("[experiment\n")
    with pytest.raises(InvalidInput, match="broken.toml: not valid TOML"):
        load_spec(broken)


def test_expansion_is_complete_shuffled_and_reproducible():
    exp = parse_spec(MINIMAL)
    runs = expand(exp)
    assert len(runs) == 2 * 2 * 2 * 1 * 4
    assert len({r.run_id for r in runs}) == len(runs)
    cells = collections.Counter(r.cell for r in runs)
    assert set(cells.values()) == {4}
    assert [r.run_id for r in expand(exp)] == [r.run_id for r in runs]
    in_order = sorted(runs, key=lambda r: r.run_id)
    assert runs != in_order
    other = parse_spec({**MINIMAL, "experiment": {**MINIMAL["experiment"], "seed": 6}})
    assert [r.run_id for r in expand(other)] != [r.run_id for r in runs]


def test_blocked_order_groups_competing_levels():
    exp = parse_spec({**MINIMAL, "experiment": {**MINIMAL["experiment"], "order": "blocked"}})
    levels = [r.competing for r in expand(exp)]
    changes = sum(1 for a, b in zip(levels, levels[1:]) if a != b)
    assert changes == 1
    strategies = [r.strategy for r in expand(exp)[:16]]
    assert strategies != sorted(strategies)


def test_remaining_keeps_order_and_skips_done():
    runs = expand(parse_spec(MINIMAL))
    done = {runs[0].run_id, runs[5].run_id}
    left = remaining(runs, done)
    assert len(left) == len(runs) - 2
    assert [r.run_id for r in left] == [r.run_id for r in runs if r.run_id not in done]


def test_run_seed_is_stable_and_distinct():
    runs = expand(parse_spec(MINIMAL))
    seeds = [r.seed(5) for r in runs]
    assert len(set(seeds)) == len(seeds)
    assert seeds == [r.seed(5) for r in runs]
