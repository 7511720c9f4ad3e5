"""Every file of the qos layer: one error (ConfigError naming file and key), unknown keys
refused, one unit for rates (kbit/s, keys ending in _kbit) with the old spellings refused."""

from __future__ import annotations

import pytest

from pathmaster.records import ConfigError
from qos.classes import load_classes
from qos.emulator.config import EmulatorConfig
from qos.emulator.config import load_config as load_emulator
from qos.experiment.spec import Experiment, load_spec
from qos.testbed.config import TestbedConfig
from qos.testbed.config import load_config as load_testbed

EMULATOR = '[link.l]\nrate_kbit = 1000\n[link.l.forward]\nqueue = 1\nout = "eth0"\n'

MISSPELT = {  # loader, file text, the key path the message must name
    "testbed": (load_testbed, "[bottleneck]\nrate_kibt = 10000\n", "[bottleneck] rate_kibt: unknown key"),
    "emulator": (load_emulator, EMULATOR.replace("rate_kbit", "rate_kbit = 1000\ndelay_sm"),
                 "[link.l] delay_sm: unknown key"),
    "experiment": (load_spec, '[experiment]\nname = "t"\n[strategies.fifo]\ndiscipline = "fifo"\n'
                              '[[links]]\nname = "a"\ncore_kbit = 1000\nqueue_pakets = 40\n',
                   "[links[0]] queue_pakets: unknown key"),
    "classes": (load_classes, "[classes.urgent]\ndscp = 34\nprioirty = 0\n", "[classes.urgent] prioirty: unknown key"),
}


@pytest.mark.parametrize("kind", sorted(MISSPELT))
def test_a_misspelt_key_fails_naming_file_and_key(kind, tmp_path):
    load, text, message = MISSPELT[kind]
    path = tmp_path / f"{kind}.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize("load, text, message", [
    (load_testbed, "[bottleneck]\nrate_bps = 10_000_000\n",
     "[bottleneck] rate_bps: old spelling; use rate_kbit = 10000 (kbit/s)"),
    (load_testbed, "lan_rate_bps = 100_000_000\n",
     "lan_rate_bps: old spelling; use lan_rate_kbit = 100000 (kbit/s)"),
    (load_emulator, EMULATOR.replace("rate_kbit = 1000", 'rate = "10mbit"'),
     "[link.l] rate: old spelling; use rate_kbit = 10000 (kbit/s)"),
    (load_emulator, EMULATOR.replace("rate_kbit = 1000", 'rate_kbit = 1000\ndelay = "20ms"'),
     "[link.l] delay: old spelling; use delay_ms = 20 (ms)"),
])
def test_an_old_rate_spelling_names_the_new_one(load, text, message, tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == f"{path}: {message}"


def test_the_top_level_models_export_a_json_schema():
    for model in (TestbedConfig, EmulatorConfig, Experiment):
        schema = model.model_json_schema()
        assert schema["additionalProperties"] is False and schema["properties"]
    assert "rate_kbit" in TestbedConfig.model_json_schema()["$defs"]["Bottleneck"]["properties"]
    assert "rate_bps" not in TestbedConfig.model_json_schema()["$defs"]["Bottleneck"]["properties"]


def test_default_toml_spells_out_the_models_defaults():
    assert load_testbed().to_dict() == TestbedConfig().to_dict()
