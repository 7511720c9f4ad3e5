"""`pathmaster config schema`: the JSON Schema of each configuration file type.

The committed schemas in docs/config-schema/ must equal what the command prints. When a
configuration model changes, regenerate them with

    pathmaster config schema --out docs/config-schema
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pathmaster.cli import main
from services import config_commands

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "config-schema"


@pytest.mark.parametrize("name", ["site", "coordinator", "testbed", "emulator", "experiment"])
def test_committed_schema_is_what_the_command_prints(name, capsys):
    assert main(["config", "schema", name]) == 0
    printed = capsys.readouterr().out
    assert (SCHEMA_DIR / f"{name}.schema.json").read_text() == printed, (
        f"docs/config-schema/{name}.schema.json is stale: run "
        "`pathmaster config schema --out docs/config-schema`")


def test_schema_forbids_unknown_keys_and_shows_defaults(capsys):
    main(["config", "schema", "coordinator"])
    schema = json.loads(capsys.readouterr().out)
    table = schema["$defs"]["CoordinatorTable"]
    assert schema["additionalProperties"] is False and table["additionalProperties"] is False
    assert table["properties"]["max_cells"]["default"] == 64


def test_without_name_lists_the_file_types(capsys):
    assert main(["config", "schema"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["site", "coordinator", "testbed", "emulator", "experiment"]


def test_out_writes_one_file_per_type(tmp_path, capsys):
    assert main(["config", "schema", "site", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "site.schema.json").read_text() == config_commands.schema_text("site")


def test_a_model_without_schema_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(config_commands.SCHEMAS, "site", "qos.transport.TLSFiles")  # a plain dataclass
    assert main(["config", "schema", "site"]) == 1
    assert "site: not yet available" in capsys.readouterr().err
