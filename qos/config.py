"""The qos layer's configuration files: one base model, one way to read TOML, one error.

Every file of the qos layer (testbed, emulator, experiment, request classes) is a pydantic
model built on `FileModel` (unknown keys refused), read with `read_toml` and validated
with `validate`, which turns pydantic's `ValidationError` into the project's one
`pathmaster.records.ConfigError` naming the file and the key:

    experiment.toml: [links[0]] queue_pakets: unknown key
    bed.toml: [bottleneck] rate_bps: old spelling; use rate_kbit = 10000 (kbit/s)

Units are in the key names: rates `_kbit` (kbit/s, the study's unit and Cisco IOS's
`bandwidth` unit), times `_ms` (delays, jitter) or `_s` (durations), sizes `_bytes`,
queues `_packets`. `renamed` refuses a key of an older dialect and says the new one.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Callable, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from pathmaster.records import ConfigError

M = TypeVar("M", bound=BaseModel)

_RATE_UNITS = {"bit": 1e-3, "kbit": 1.0, "mbit": 1e3, "gbit": 1e6}  # -> kbit/s
_TIME_UNITS = {"s": 1e3, "ms": 1.0, "us": 1e-3}  # -> ms


class FileModel(BaseModel):
    """A table of a configuration file: unknown keys are refused, values are not coerced
    across kinds (a string is not a number, true is not 1); lists become tuples (`Seq`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


T = TypeVar("T")
Seq = Annotated[tuple[T, ...], Field(strict=False)]  # a TOML array, held as a tuple


def _with_unit(value: Any, units: dict[str, float]) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)\s*", str(value).lower())
    if not m or m.group(2) not in units:
        return None
    return float(m.group(1)) * units[m.group(2)]


def one_of(value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """`value` when it is in `allowed`; else ValueError naming the choices (for field validators)."""
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def renamed(new: str, scale: float | None = None, units: dict[str, float] | None = None) -> Any:
    """A field type for a key of an older dialect: any value is refused with the new spelling.

    scale : a number in the old key times `scale` is the new key's value (e.g. bit/s -> kbit/s
        is 1e-3); units : for old strings such as "10mbit", each unit's factor to the new unit.
    """

    def refuse(value: Any) -> Any:
        hint = ""
        if scale is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            hint = f" = {_number(value * scale)}"
        elif units is not None:
            converted = _with_unit(value, units)
            if converted is not None:
                hint = f" = {_number(converted)}"
        unit = "kbit/s" if new.endswith("_kbit") else "ms" if new.endswith("_ms") else ""
        raise ValueError(f"old spelling; use {new}{hint}" + (f" ({unit})" if unit else ""))

    return Annotated[SkipJsonSchema[Any], AfterValidator(refuse), Field(default=None, exclude=True, repr=False)]


def old_rate(new: str = "rate_kbit") -> Any:
    """`rate = "10mbit"` (the emulator's former strings, or bit/s numbers) -> use `new`."""
    return renamed(new, scale=1e-3, units=_RATE_UNITS)


def old_time(new: str) -> Any:
    """`delay = "20ms"` (former strings, or seconds as numbers) -> use `new` in ms."""
    return renamed(new, scale=1e3, units=_TIME_UNITS)


def key_path(loc: tuple) -> str:
    """pydantic's error location -> ``[table.sub] key`` (list entries as ``[links[0]] key``)."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int) and parts:
            parts[-1] += f"[{item}]"
        else:
            parts.append(str(item))
    if not parts:
        return ""
    if len(parts) == 1:
        return parts[0]
    return f"[{'.'.join(parts[:-1])}] {parts[-1]}"


_UNION_MEMBERS = {"int", "float", "str", "bool", "none", "dict[str,any]", "list[any]"}


def _problem(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing (required)"
    if kind == "too_short":
        return f"needs at least {error['ctx']['min_length']} entry, has {error['ctx']['actual_length']}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    message = message[:1].lower() + message[1:]
    if kind not in ("value_error", "assertion_error") and not isinstance(error.get("input"), (dict, list)):
        message += f", got {error.get('input')!r}"
    return message


def config_error(exc: ValidationError, source: str | Path | None, prefix: tuple = (),
                 rename: Callable[[tuple], tuple] | None = None) -> ConfigError:
    """The first problem of a `ValidationError` as a `ConfigError` naming `source` and the key.

    prefix : where in the file the validated table sits (e.g. ``("link", "wan", "forward")``).
    rename : maps a location to the file's own (e.g. a list index back to its table's name).
    """
    problems: dict[tuple, dict] = {}
    for error in exc.errors(include_url=False):
        # A union's members (int | float) report under their own names; they are one key.
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and (
            p in _UNION_MEMBERS or p.startswith(("function-", "lax-", "strict-")))))
        loc = rename(loc) if rename else loc
        if loc in problems and {problems[loc]["type"], error["type"]} == {"int_type", "float_type"}:
            problems[loc] = {**error, "type": "number_type", "msg": "Input should be a number"}
        problems.setdefault(loc, error)
    # "too short" of a list whose entries failed is a consequence, not a problem of its own.
    problems = {loc: e for loc, e in problems.items()
                if not (e["type"] == "too_short" and any(len(o) > len(loc) and o[:len(loc)] == loc
                                                         for o in problems))}
    # An old spelling first: its message says what to write instead, which settles the rest.
    ordered = sorted(problems.items(), key=lambda item: "old spelling" not in item[1]["msg"])
    loc, first = ordered[0]
    problem = _problem(first)
    if len(ordered) > 1:
        problem += f" (and {len(ordered) - 1} more problem{'s' if len(ordered) > 2 else ''})"
    return ConfigError(problem, source, key_path(tuple(prefix) + loc) or None)


def validate(model: type[M], data: Any, source: str | Path, prefix: tuple = (),
             rename: Callable[[tuple], tuple] | None = None) -> M:
    """`model.model_validate(data)`, failing with a `ConfigError` that names `source` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a table, got {data!r}", source, key_path(prefix) or None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, source, prefix, rename) from None


def read_toml(path: str | Path, what: str = "configuration") -> dict:
    """A TOML file (or JSON, by suffix) as a dict; a missing or malformed file is a `ConfigError`."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return json.load(f) if path.suffix == ".json" else tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"cannot read: no such {what} file", path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path) from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}", path) from None

