"""DSCP -> class name, from the product's request-class table (`qos.classes`).

A DSCP that is a class's own code point maps to that class. The other drop precedences
of an Assured Forwarding class map to the class holding any code point of the same AF
class (AF12 and AF13 go with AF11's "teaching"), so WRED can tell them apart while the
schedulers treat them as one class (RFC 2597). Everything else is "default".
"""

from __future__ import annotations

from typing import Callable

from qos.classes import DEFAULT_CLASSES, ClassTable

DEFAULT_CLASS = "default"


def af_class(dscp: int) -> int | None:
    """The AF class number (1-4) of an Assured Forwarding DSCP, else None."""
    x, precedence = dscp >> 3, dscp & 0b111
    if 1 <= x <= 4 and precedence in (2, 4, 6):
        return x
    return None


def dscp_classifier(table: ClassTable = DEFAULT_CLASSES) -> Callable[[int], str]:
    """A function DSCP (0-63) -> class name, looked up in a 64-entry table."""
    names = [DEFAULT_CLASS] * 64
    for klass in table:
        x = af_class(klass.dscp)
        if x is not None:
            for precedence in (2, 4, 6):
                names[(x << 3) | precedence] = klass.name
    for klass in table:  # exact code points win over AF siblings
        names[klass.dscp] = klass.name
    return names.__getitem__
