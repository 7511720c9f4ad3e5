"""Site and coordinator configuration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import ConfigError, load_coordinator_config, load_site_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_example_site_config():
    config = load_site_config(DEPLOY / "site.example.toml")
    assert config.name == "connecticut" and config.algorithm == "flat" and config.workers == 2
    assert config.class_ports == {"urgent": 50061, "routine": 50062, "teaching": 50063, "bulk": 50064}
    assert config.tls.mutual and config.tls.cert == DEPLOY / "certs" / "connecticut.pem"


def test_example_coordinator_config():
    config = load_coordinator_config(DEPLOY / "coordinator.example.toml")
    assert [s.name for s in config.sites] == ["connecticut", "new-york", "california"]
    assert config.sites[0].address == "ct.example.org:50051"
    assert config.max_case_bytes == 64 * 2**20 and config.max_cells == 64
    assert config.tls.mutual and config.site_tls.cert == DEPLOY / "certs" / "coordinator.pem"
    assert config.classes["urgent"].dscp == 34


@pytest.mark.parametrize("text, message", [
    ('[site]\nname = "a"\n', "[site] db: missing"),
    ('[site]\nname = "a"\ndb = "x"\nworkers = "two"\n', "[site] workers: expected int"),
    ('[site]\nname = "a"\ndb = "x"\nlisten = "nowhere"\n', "[site] listen: address 'nowhere' is not HOST:PORT"),
    ('[site]\nname = "a"\ndb = "x"\nclass_ports = { express = 1 }\n', "unknown class 'express'"),
    ('[site\n', "not valid TOML"),
])
def test_site_config_errors_name_file_and_key(tmp_path, text, message):
    path = tmp_path / "site.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_site_config(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_coordinator_config_errors(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[coordinator]\n")
    with pytest.raises(ConfigError, match="no \\[\\[sites\\]\\]"):
        load_coordinator_config(path)
    path.write_text('[[sites]]\nname = "a"\naddress = "h:1"\n[[sites]]\nname = "a"\naddress = "h:2"\n')
    with pytest.raises(ConfigError, match="duplicate"):
        load_coordinator_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_coordinator_config(tmp_path / "missing.toml")
