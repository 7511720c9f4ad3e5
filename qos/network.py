"""The 2002 network's links and buffers, and the TCP and gRPC sizes a reply meets on them.

The study's network (seed 000, Methods) is 10 Mbit/s Ethernet on hubs, three subnets
joined by a shared segment; the testbed builds it and the experiments vary it. Values
the study does not give are marked as our own choice.
"""

from __future__ import annotations

# Rates in files are kbit/s (`_KBIT`), the study's unit and Cisco IOS's `bandwidth` unit.
BOTTLENECK_RATE_KBIT = 10_000  # the study's shared 10 Mbit/s segment (the testbed's core links)
ROUTER_QUEUE_PACKETS = 100     # an experiment link's router queue and the emulator's buffer when
                               # its file gives none; the project's own choice (no outside source),
                               # the one qos/experiment/results were measured with
SHAPER_BURST_BYTES = 3028      # token bucket of a shaped class: two full Ethernet frames (2 x 1514);
                               # the host-side shaping variant's (a host's own token bucket)
HUB_RATE_KBIT = 10_000        # a hub: one 10 Mbit/s half-duplex medium, both directions
HOST_CARD_RATE_KBIT = 10_000  # each workstation's 10 Mbit/s Ethernet card
HOST_CARD_QUEUE_PACKETS = 100  # the card's transmit FIFO: Linux 2.4's Ethernet txqueuelen (100);
                               # a best recollection of that era's default, no outside source
# Linux's initial congestion window (RFC 6928: 10 segments), in TCP payload bytes at a 1500 B
# MTU with timestamps (1448 B a segment). tcp_slow_start_after_idle brings a warm connection
# that has been idle back to it, so a reply larger than this waits for a round trip of ACKs.
TCP_INITIAL_WINDOW_BYTES = 10 * 1448
# What a unary gRPC reply adds to its message on a warm connection: the 5 B message prefix,
# a 9 B HTTP/2 DATA frame header, and HPACK-indexed response headers and trailers (~60 B).
GRPC_REPLY_FRAMING_BYTES = 74
