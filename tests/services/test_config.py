"""Site and coordinator configuration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathmaster.records import ConfigError
from services.config import load_coordinator_config, load_site_config

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


def test_coordinator_class_ports(tmp_path):
    path = tmp_path / "c.toml"
    sites = '[[sites]]\nname = "a"\naddress = "h:1"\n'
    path.write_text(sites)
    assert load_coordinator_config(path).class_ports == {"urgent": 0, "routine": 0, "teaching": 0, "bulk": 0}
    path.write_text("[coordinator]\nclass_port_base = 50071\n" + sites)
    assert load_coordinator_config(path).class_ports == {
        "urgent": 50071, "routine": 50072, "teaching": 50073, "bulk": 50074}
    path.write_text("[coordinator]\nclass_ports = { urgent = 50081 }\n" + sites)
    assert load_coordinator_config(path).class_ports == {"urgent": 50081}


@pytest.mark.parametrize("line, message", [
    ("class_port_base = 65534", "[coordinator] class_port_base: expected a port 1-65532, got 65534"),
    ("class_port_base = 1\nclass_ports = {}", "either class_ports or class_port_base"),
    ("class_ports = { urgent = 70000 }", "[coordinator] class_ports: urgent: expected a port number"),
    ("class_ports = { express = 1 }", "unknown class 'express'"),
])
def test_coordinator_class_port_errors(tmp_path, line, message):
    path = tmp_path / "c.toml"
    path.write_text(f'[coordinator]\n{line}\n[[sites]]\nname = "a"\naddress = "h:1"\n')
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(path)
    assert message in str(err.value)


@pytest.mark.parametrize("name", sorted(p.name for p in DEPLOY.glob("*.toml")))
def test_every_example_config_loads(name):
    load = load_site_config if name.startswith("site") else load_coordinator_config
    assert load(DEPLOY / name)


SITE = '[site]\nname = "a"\ndb = "x"\n'
SITES = '[[sites]]\nname = "a"\naddress = "h:1"\n'


@pytest.mark.parametrize("load, text, message", [
    (load_site_config, SITE + "workrs = 2\n", "[site] workrs: unknown key"),
    (load_site_config, SITE + '[tls]\ncrt = "c.pem"\n', "[tls] crt: unknown key"),
    (load_site_config, SITE + '[sight]\nname = "b"\n', "[sight]: unknown table"),
    (load_coordinator_config, "[coordinator]\nmax_cell = 4\n" + SITES, "[coordinator] max_cell: unknown key"),
    (load_coordinator_config, SITES + "port = 1\n", "[[sites]] #1 port: unknown key"),
    (load_coordinator_config, SITES + '[tls]\nmutal = true\n', "[tls] mutal: unknown key"),
    (load_coordinator_config, SITES + '[site_tls]\nca_file = "ca.pem"\n', "[site_tls] ca_file: unknown key"),
])
def test_unknown_key_names_file_and_key(tmp_path, load, text, message):
    path = tmp_path / "settings.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == f"{path}: {message}"


def test_values_keep_their_toml_type(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text(SITE + 'workers = "2"\n')
    with pytest.raises(ConfigError, match=r"\[site\] workers: expected int, got '2'"):
        load_site_config(path)


def test_relative_paths_are_beside_the_file(tmp_path):
    path = tmp_path / "site.toml"
    path.write_text(SITE + '[tls]\ncert = "certs/s.pem"\n')
    config = load_site_config(path)
    assert config.db == tmp_path / "x" and config.tls.cert == tmp_path / "certs" / "s.pem"
