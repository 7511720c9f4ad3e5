"""`pathmaster config schema [NAME] [--out DIR]`: the JSON Schema of each configuration file.

Editors can check and complete TOML files against these (e.g. Taplo's `#:schema PATH`
comment). docs/config-schema/ holds them, written by
`pathmaster config schema --out docs/config-schema`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

# File type -> the pydantic model of the whole file, imported only when asked for.
SCHEMAS = {
    "site": "services.config.SiteFile",
    "coordinator": "services.config.CoordinatorFile",
    "testbed": "qos.testbed.config.TestbedConfig",
    "emulator": "qos.emulator.config.EmulatorConfig",
    "experiment": "qos.experiment.spec.Experiment",
}


class SchemaUnavailable(LookupError):
    """The file type's model exports no JSON Schema (not a pydantic model yet)."""


def schema_text(name: str) -> str:
    """The JSON Schema of file type `name`, as the command prints and writes it."""
    module_name, _, model_name = SCHEMAS[name].rpartition(".")
    model = getattr(importlib.import_module(module_name), model_name)
    if not hasattr(model, "model_json_schema"):
        raise SchemaUnavailable(f"{name}: not yet available ({SCHEMAS[name]} is not a pydantic model)")
    return json.dumps(model.model_json_schema(), indent=2, ensure_ascii=False) + "\n"


def register(subparsers) -> None:
    config = subparsers.add_parser("config", help="about the configuration files")
    which = config.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    schema = which.add_parser(
        "schema", help="print the JSON Schema of a configuration file type",
        description="Print the JSON Schema of the configuration file type NAME; without NAME, "
                    f"list the types ({', '.join(SCHEMAS)}).")
    schema.add_argument("name", nargs="?", choices=list(SCHEMAS), metavar="NAME",
                        help=f"one of: {', '.join(SCHEMAS)}")
    schema.add_argument("--out", type=Path, metavar="DIR",
                        help="write NAME.schema.json into DIR (every type when NAME is not given)")
    schema.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    if args.name is None and args.out is None:
        width = max(map(len, SCHEMAS))
        print("\n".join(f"{name:<{width}}  {model}" for name, model in SCHEMAS.items()))
        return 0
    status = 0
    for name in [args.name] if args.name else SCHEMAS:
        try:
            text = schema_text(name)
        except SchemaUnavailable as exc:
            print(f"pathmaster config schema: {exc}", file=sys.stderr)
            status = 1
            continue
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.schema.json").write_text(text)
            print(f"wrote {args.out / f'{name}.schema.json'}")
    return status
