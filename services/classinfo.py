"""The request-class table on the wire: what the coordinator's `Info` says and clients learn.

The coordinator's table (its `[classes]`, or the default one) is the one source for every
client (query, batch, gateway, the experiment driver in service mode): they offer, check
and mark requests with the classes `Info` lists, never a table of their own.
"""

from __future__ import annotations

from dataclasses import asdict

from qos.classes import DEFAULT_CLASSES, ClassTable
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb


def class_messages(classes: ClassTable) -> list[pb.RequestClass]:
    """The table as `Info` carries it, most favoured first."""
    return [pb.RequestClass(**asdict(c)) for c in classes]


def table_from_info(info: pb.CoordinatorInfo | None) -> ClassTable:
    """The coordinator's table from its `Info`.

    Older coordinators say less: one from before `classes` was added gives names and DSCPs
    only (`class_dscp`: no descriptions; the order of favour, unknown, is taken as the
    higher DSCP first); one from before Info (None here), or one that lists no class at
    all, says nothing, and gets the table every coordinator then had unless its
    configuration said otherwise: the default one.
    """
    if info is not None and info.classes:
        return ClassTable({c.name: {"dscp": c.dscp, "priority": c.priority, "description": c.description}
                           for c in info.classes})
    if info is not None and info.class_dscp:
        ranked = sorted(info.class_dscp.items(), key=lambda item: (-item[1], item[0]))
        return ClassTable({name: {"dscp": dscp, "priority": i} for i, (name, dscp) in enumerate(ranked)})
    return DEFAULT_CLASSES
