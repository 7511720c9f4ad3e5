"""The emulator's configuration file: what it builds, and the errors it gives for bad input."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import qos.emulator
from qos.emulator.config import ConfigError, config_from_dict, load_config, parse_rate, parse_time
from qos.emulator.disciplines import ClassWfq, FlowFq, Priority, Wred
from qos.emulator.launch import interface_config, settings_from_strategy

EXAMPLE = Path(qos.emulator.__file__).with_name("example.toml")


def one_link(**settings) -> dict:
    return {"link": {"l": {"rate_kbit": 10_000, **settings, "forward": {"queue": 1, "out": "eth0"}}}}


def test_the_example_builds_both_directions(tmp_path):
    config = load_config(EXAMPLE)
    forward, reverse = config.directions
    assert (forward.name, forward.queue, forward.match) == ("uplink.forward", 0, ["-o", "rA-eth4"])
    assert (reverse.queue, reverse.match) == (1, ["-i", "rA-eth4"])
    link = forward.build(random.Random(0))
    assert isinstance(link.scheduler, ClassWfq) and link.scheduler.weights["urgent"] == 5
    assert link.delay == 0.020 and link.overhead == 14 and link.rate_bps == 10e6
    assert set(link.shapers) == {"bulk"}
    assert config.sample_interval_s == 0.1 and config.seed == 1
    back = reverse.build(random.Random(0))
    assert isinstance(back.scheduler, Wred)
    assert back.scheduler.profiles[10].min_th == 50  # seed 003's AF11
    assert back.scheduler.profiles[18].min_th == 32  # Cisco's AF21 default
    assert back.shapers.keys() == {"bulk"}           # link-level keys apply to both directions


@pytest.mark.parametrize("text, unit_value", [("10mbit", 10e6), ("1.5Mbit", 1.5e6), ("500kbit", 5e5),
                                              (2_000_000, 2e6), ("1gbit", 1e9)])
def test_rates(text, unit_value):
    assert parse_rate(text) == unit_value


def test_times():
    assert parse_time("20ms") == 0.020 and parse_time("250us") == 250e-6 and parse_time(0) == 0.0
    with pytest.raises(ConfigError, match="delay: expected a time"):
        parse_time("20 parsecs", "delay")


@pytest.mark.parametrize("settings, message", [
    ({"rate_kbit": "fast"}, r"\[link\.l\] rate_kbit: .*number, got 'fast'"),
    ({"discipline": "red"}, r"discipline: 'red' is not one of fifo, priority, wfq, fq, flow_wfq, wred"),
    ({"delay_ms": 5, "jitter_ms": 10}, r"jitter_ms: 10 is larger than the delay"),
    ({"loss": 1.5}, r"loss: expected a probability"),
    ({"limit_packets": 0}, r"limit_packets: expected a positive integer"),
    ({"discipline": "wfq", "wfq": {"weights": {"gold": 2}}}, r"unknown class 'gold'"),
    ({"discipline": "wfq", "wfq": {"weights": {"bulk": -1}}}, r"weights\] bulk: expected a positive number"),
    ({"discipline": "priority", "priority": {"bands": {"urgent": "top"}}}, r"unknown priority band 'top'"),
    ({"discipline": "wred", "wred": {"dscp": {"AF11": [70, 50, 10]}}}, r"0 <= min < max"),
    ({"discipline": "wred", "wred": {"dscp": {"AF99": [5, 10, 10]}}}, r"'AF99' is neither a DSCP"),
    ({"shape": {"bulk": {"rate_kbit": 1000, "burst_bytes": 100}}}, r"shape\] bulk: .*smaller than one full frame"),
    ({"wfq": {"weights": {"bulk": 1}}}, r"a \[wfq\] table but discipline = 'fifo'"),
    ({"colour": "blue"}, r"\[link\.l\] colour: unknown key"),
])
def test_bad_settings_are_named(settings, message):
    data = one_link(**settings)
    with pytest.raises(ConfigError, match=message) as err:
        config_from_dict(data, "test.toml")
    assert str(err.value).startswith("test.toml: ")


@pytest.mark.parametrize("old, new", [
    ({"rate": "10mbit"}, r"\[link\.l\] rate: old spelling; use rate_kbit = 10000 \(kbit/s\)"),
    ({"rate": 1e6}, r"rate: old spelling; use rate_kbit = 1000 \(kbit/s\)"),
    ({"delay": "20ms"}, r"delay: old spelling; use delay_ms = 20 \(ms\)"),
    ({"jitter": "500us"}, r"jitter: old spelling; use jitter_ms = 0.5 \(ms\)"),
    ({"overhead": 14}, r"overhead: old spelling; use overhead_bytes"),
    ({"limit": 40}, r"limit: old spelling; use limit_packets"),
    ({"shape": {"bulk": {"rate": "1mbit"}}}, r"\[link\.l\.shape\.bulk\] rate: old spelling; use rate_kbit = 1000"),
])
def test_old_spellings_name_the_new_one(old, new):
    with pytest.raises(ConfigError, match=new):
        config_from_dict(one_link(**old), "old.toml")


def test_bad_files_name_the_file(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[link.l\nrate = 1")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read"):
        load_config(tmp_path / "missing.toml")
    no_queue = tmp_path / "q.toml"
    no_queue.write_text('[link.l]\nrate_kbit = 1000\n[link.l.forward]\nout = "e0"\n')
    with pytest.raises(ConfigError, match=r"q\.toml: \[link\.l\.forward\] queue: missing"):
        load_config(no_queue)
    clash = {"link": {"a": {"rate_kbit": 1000, "forward": {"queue": 1, "out": "x"}},
                      "b": {"rate_kbit": 1000, "forward": {"queue": 1, "out": "y"}}}}
    with pytest.raises(ConfigError, match="NFQUEUE numbers must differ"):
        config_from_dict(clash)
    with pytest.raises(ConfigError, match="says nothing about which packets"):
        config_from_dict({"link": {"a": {"rate_kbit": 1000, "forward": {"queue": 1}}}})


def test_a_direction_overrides_the_link():
    data = one_link(discipline="fifo", limit_packets=30)
    data["link"]["l"]["reverse"] = {"queue": 2, "in": "eth0", "discipline": "priority"}
    forward, reverse = config_from_dict(data).directions
    assert forward.settings["discipline"] == "fifo"
    prio = reverse.build(random.Random(0)).scheduler
    assert isinstance(prio, Priority) and [q.limit for q in prio.queues] == [30] * 4
    data["link"]["l"]["reverse"]["discipline"] = "fq"
    fq = config_from_dict(data).directions[1].build(random.Random(0)).scheduler
    assert isinstance(fq, FlowFq) and fq.limit == 30


def test_the_testbeds_strategy_tables_translate():
    assert settings_from_strategy({"rate_kbit": 1e4, "strategy": "shares", "weights": {"urgent": 3}}) == {
        "rate_kbit": 1e4, "limit_packets": 40, "discipline": "wfq", "wfq": {"weights": {"urgent": 3}}}
    shaped = settings_from_strategy({"rate_kbit": 1e4, "strategy": "shaping", "shaped_class": "bulk",
                                     "shaped_rate_kbit": 4000, "overhead_bytes": 14})
    assert shaped["shape"]["bulk"]["rate_kbit"] == 4000 and shaped["overhead_bytes"] == 14
    with pytest.raises(ConfigError, match="'shaping' needs shaped_rate_kbit"):
        settings_from_strategy({"strategy": "shaping", "shaped_class": "bulk"})
    with pytest.raises(ConfigError, match="unknown strategy 'cbq'"):
        settings_from_strategy({"strategy": "cbq"})
    both = config_from_dict(interface_config(["rA-eth4"], {"rate_kbit": 1e4, "strategy": "priority"}))
    assert [(d.queue, d.match) for d in both.directions] == [(0, ["-o", "rA-eth4"]), (1, ["-i", "rA-eth4"])]
