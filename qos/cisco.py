"""Cisco IOS's published defaults for the queueing the 2002 study's routers ran.

Both testbed backends (the user-space emulator and the kernel's qdiscs) and the emulated
IOS strategies (`qos.emulator.ios`) take these values when a table gives none; each is
cited where it is defined, so a reader can check it against its source.
"""

from __future__ import annotations

HOLD_QUEUE_PACKETS = 40        # Cisco IOS interface output hold queue: the testbed's bottleneck
                               # buffer, on both backends, when its table gives none
CONGESTIVE_DISCARD_PACKETS = 64  # Cisco IOS fair-queue congestive discard threshold: one WFQ
                                 # class's queue, one shaped class's queue in the emulator
PRIORITY_QUEUE_LIMITS_PACKETS = (20, 40, 60, 80)  # Cisco IOS priority queuing's queue-limit
                                                  # defaults, bands high, medium, normal, low
# Cisco IOS `fair-queue` (per-flow WFQ), interface defaults: congestive discard threshold
# 64 messages (CONGESTIVE_DISCARD_PACKETS above), 256 dynamic conversation queues, and the
# WFQ system's hold-queue limit of 1000 packets ("Cisco IOS in a Nutshell", fair-queue and
# hold-queue; ccexpert.us "QoS implementing": "default hold-queue limit with WFQ is 1000").
WFQ_DYNAMIC_QUEUES = 256
WFQ_HOLD_QUEUE_PACKETS = 1000
# A conversation's weight is 32384 / (IP precedence + 1) from IOS 12.0(5)T on (4096 / (p + 1)
# before); a packet's sequence number grows by weight x length, lowest number sent first.
WFQ_WEIGHT_NUMERATOR = 32384
# Cisco IOS weighs a WFQ flow by IP precedence + 1: AF41 -> 5, AF21 -> 3, AF11 -> 2, LE -> 1.
WFQ_WEIGHTS = {"urgent": 5, "routine": 3, "teaching": 2, "bulk": 1}
# Cisco IOS traffic shaping (`traffic-shape rate bit-rate [burst-size [excess-burst-size]]`):
# "burst-size ... the sustained number of bits that can be transmitted per interval ... Default
# is the bit-rate divided by 8", i.e. Bc = CIR x 125 ms, and excess-burst-size defaults to
# burst-size ("Cisco IOS in a Nutshell", O'Reilly, traffic-shape rate; oreilly.com/library/view/
# cisco-ios-in/156592942X/re703.html). 4000 kbit/s -> 62,500 B; 200 kbit/s -> 3,125 B.
IOS_SHAPING_INTERVAL_S = 0.125
# WRED (Cisco IOS `random-detect`): the profile of a DSCP with no profile of its own is
# min 20, max 40 packets, mark-probability denominator 10; exponential weighting constant 9.
WRED_DEFAULT_PROFILE = (20, 40, 10)
WRED_WEIGHT_EXPONENT = 9
# IOS `random-detect` (precedence-based, the interface default): minimum thresholds for IP
# precedence 0-7, evenly spaced from half the maximum threshold (40) towards it; maximum 40
# and mark-probability denominator 10 for all. Cisco's command references say "half the
# max-threshold for precedence 0, the rest evenly spaced"; the exact numbers are the IOS 12.x
# default table as remembered (BRIEF §7), which that rule reproduces (20 + 20 p / 9, floored).
WRED_PRECEDENCE_MIN_THRESHOLDS = (20, 22, 24, 26, 28, 31, 33, 35)
WRED_MAX_THRESHOLD = 40
WRED_MARK_DENOMINATOR = 10
