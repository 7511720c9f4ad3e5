"""Queueing disciplines of the link emulator, each a scheduler on a virtual clock."""

from qos.emulator.disciplines.base import Discipline, PacketQueue
from qos.emulator.disciplines.codel import ClassCodel, Codel, CodelState
from qos.emulator.disciplines.fifo import Fifo
from qos.emulator.disciplines.medium import SharedMedium
from qos.emulator.disciplines.priority import BANDS, Priority
from qos.emulator.disciplines.shaper import TokenBucketShaper
from qos.emulator.disciplines.wfq import ClassWfq, FlowFq, FlowWfq, ios_weight
from qos.emulator.disciplines.wred import (CISCO_DSCP_DEFAULTS, CISCO_PRECEDENCE_DEFAULTS, SEED003_AF1, Wred,
                                          WredProfile)

__all__ = ["Discipline", "PacketQueue", "Codel", "ClassCodel", "CodelState", "SharedMedium", "Fifo", "Priority", "BANDS", "ClassWfq", "FlowFq", "FlowWfq", "ios_weight",
           "Wred", "WredProfile", "CISCO_DSCP_DEFAULTS", "CISCO_PRECEDENCE_DEFAULTS", "SEED003_AF1", "TokenBucketShaper"]
