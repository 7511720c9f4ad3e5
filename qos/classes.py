"""Request classes and their DiffServ code points (BRIEF §5; RFC 4594, RFC 2597, RFC 8622).

The table is data: `load_classes(path)` reads a TOML file of the same shape as
`DEFAULT_TABLE` so a deployment can re-map classes without code changes.

    [classes.urgent]
    dscp = 34            # AF41
    description = "intra-operative diagnosis"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from qos.config import FileModel, config_error, read_toml, validate


@dataclass(frozen=True)
class RequestClass:
    """One request class: its name, DSCP (0-63) and the order in which it is favoured."""

    name: str
    dscp: int
    priority: int  # 0 = most favoured
    description: str = ""

    @property
    def tos(self) -> int:
        """The IPv4 TOS byte / IPv6 traffic class carrying this DSCP (ECN bits zero)."""
        return self.dscp << 2


# The product's default table. LE (1) for bulk follows RFC 8622; CS1 (8) is the older choice.
DEFAULT_TABLE: dict[str, dict] = {
    "urgent": {"dscp": 34, "priority": 0, "description": "intra-operative diagnosis (AF41)"},
    "routine": {"dscp": 18, "priority": 1, "description": "diagnostic query (AF21)"},
    "teaching": {"dscp": 10, "priority": 2, "description": "batch teaching-set queries (AF11)"},
    "bulk": {"dscp": 1, "priority": 3, "description": "competing/background transfers (LE)"},
}

DSCP_NAMES = {
    0: "CS0", 1: "LE", 8: "CS1", 10: "AF11", 12: "AF12", 14: "AF13", 16: "CS2", 18: "AF21",
    20: "AF22", 22: "AF23", 24: "CS3", 26: "AF31", 28: "AF32", 30: "AF33", 32: "CS4",
    34: "AF41", 36: "AF42", 38: "AF43", 40: "CS5", 46: "EF", 48: "CS6", 56: "CS7",
}


class UnknownClass(KeyError):
    """A request class name that is not in the table."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        super().__init__(f"unknown request class {name!r}; known classes: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


class ClassEntry(FileModel):
    """One `[classes.NAME]` table."""

    dscp: int = Field(description="DiffServ code point, 0-63 (e.g. 34 = AF41)")
    priority: int | None = Field(None, ge=0, description="0 = most favoured; default: the table's order")
    description: str = ""

    @field_validator("dscp")
    @classmethod
    def _dscp_range(cls, dscp: int) -> int:
        if not 0 <= dscp <= 63:
            raise ValueError(f"DSCP {dscp} is outside 0-63")
        return dscp


class ClassesFile(FileModel):
    """A request-class table file: `[classes.NAME]` tables (see `DEFAULT_TABLE`)."""

    classes: dict[str, ClassEntry] = Field(min_length=1)


class ClassTable:
    """The request classes in force, by name (a lookup object; its file form is `ClassesFile`).

    `table` maps class names to `[classes.NAME]`-shaped dicts; a bad entry raises
    `ValueError` (pydantic's `ValidationError`); `load_classes` names the file and key.
    """

    def __init__(self, table: dict[str, dict] | None = None):
        table = DEFAULT_TABLE if table is None else table
        self._classes: dict[str, RequestClass] = {}
        for name, entry in table.items():
            if not isinstance(entry, ClassEntry):
                try:
                    entry = ClassEntry.model_validate(entry)
                except ValidationError as exc:  # ConfigError is a ValueError
                    raise config_error(exc, None, ("classes", name)) from None
            self._classes[name] = RequestClass(
                name=name,
                dscp=entry.dscp,
                priority=len(self._classes) if entry.priority is None else entry.priority,
                description=entry.description,
            )

    def __getitem__(self, name: str) -> RequestClass:
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownClass(name, self.names()) from None

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self):
        return iter(sorted(self._classes.values(), key=lambda c: c.priority))

    def names(self) -> list[str]:
        return [c.name for c in self]

    def by_dscp(self, dscp: int) -> RequestClass | None:
        return next((c for c in self if c.dscp == dscp), None)

    def to_table(self) -> dict[str, dict]:
        """The table as data, in `DEFAULT_TABLE`'s shape (`ClassTable(t.to_table())` equals `t`),
        most favoured first: what a record or a message carries."""
        return {c.name: {"dscp": c.dscp, "priority": c.priority, "description": c.description} for c in self}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassTable) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(tuple(self))


def parse_classes(data: dict, source: str | Path = "<classes>") -> ClassTable:
    """A class table from an already parsed file (`{"classes": {NAME: {...}}}`); raises
    `ConfigError` naming `source` and the key."""
    checked = validate(ClassesFile, data, source)
    return ClassTable(dict(checked.classes))


def load_classes(path: str | Path | None = None) -> ClassTable:
    """Read a class table from a TOML file (`[classes.NAME] dscp = ...`); None gives the default.
    Raises `ConfigError` naming the file and the key."""
    if path is None:
        return ClassTable()
    return parse_classes(read_toml(path, "request-class table"), path)


DEFAULT_CLASSES = ClassTable()
