"""Every default and limit of the project, in one place.

Each layer reads its defaults from here (the core, the QoS transport and testbed, the
services and clients), so a value is typed once and a change is made once. Units are in
the names: `_BYTES`, `_PIXELS`, `_S` (seconds), `_MS`, `_PACKETS`, `_KBIT` (kbit/s).
Configuration models (pydantic) use these as their field defaults, and the JSON Schema
they export shows them.
"""

from __future__ import annotations

# --- Retrieval -------------------------------------------------------------------------
K = 5                 # matches per test cell (the study's "5 closest"); a request's 0 means this
# Forward feature selection keeps at most this many features (similarity.forward_select);
# a site that selects them advertises them, and a features request to it carries only
# these values a cell (a one-segment request).
MAX_SELECTED_FEATURES = 24

# --- Client-chosen sizes (every one bounded) ------------------------------------------
MAX_IMAGE_BYTES = 16 * 1024 * 1024   # one encoded file; a study cell is ~100 KB
MAX_PIXELS = 4096 * 4096             # one image; checked from the header, before decoding

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # one gRPC message, either way (QoS transport)

# --- Services --------------------------------------------------------------------------

# --- A site's workers, supervised (services/site/supervisor.py) ---------------------------

# --- Replies sized for the wire -----------------------------------------------------------

# --- Coordinator: own analysis and admission (qos.admission) ---------------------------------
CASE_SLOTS = 64                 # cases in progress at once at one coordinator
URGENT_RESERVED_SLOTS = 16      # of those, kept for the most favoured class (seed 004's guarantee)
CLASS_SHARE = {"teaching": 0.5, "bulk": 0.25}  # most of the shared slots one class may hold
PER_CLIENT_CASES = 16           # cases one client may have in progress at once

# --- QoS: rates and router queues ------------------------------------------------------
# Rates in files are kbit/s (`_KBIT`), the study's unit and Cisco IOS's `bandwidth` unit.
BOTTLENECK_RATE_KBIT = 10_000  # the study's shared 10 Mbit/s segment (the testbed's core links)
HOLD_QUEUE_PACKETS = 40        # Cisco IOS interface output hold queue: the testbed's bottleneck
                               # buffer, on both backends, when its table gives none
CONGESTIVE_DISCARD_PACKETS = 64  # Cisco IOS fair-queue congestive discard threshold: one WFQ
                                 # class's queue, one shaped class's queue in the emulator
ROUTER_QUEUE_PACKETS = 100     # an experiment link's router queue and the emulator's buffer when
                               # its file gives none; the project's own choice (no outside source),
                               # the one qos/experiment/results were measured with
FAIR_QUEUE_CAP_PACKETS = 1000  # flow fair queuing (the emulator's `fq`) buffer cap, all flows
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
SHAPER_BURST_BYTES = 3028      # token bucket of a shaped class: two full Ethernet frames (2 x 1514);
                               # the host-side shaping variant's (a host's own token bucket)
# Cisco IOS traffic shaping (`traffic-shape rate bit-rate [burst-size [excess-burst-size]]`):
# "burst-size ... the sustained number of bits that can be transmitted per interval ... Default
# is the bit-rate divided by 8", i.e. Bc = CIR x 125 ms, and excess-burst-size defaults to
# burst-size ("Cisco IOS in a Nutshell", O'Reilly, traffic-shape rate; oreilly.com/library/view/
# cisco-ios-in/156592942X/re703.html). 4000 kbit/s -> 62,500 B; 200 kbit/s -> 3,125 B.
IOS_SHAPING_INTERVAL_S = 0.125
# WRED (Cisco IOS `random-detect`): the profile of a DSCP with no profile of its own is
# min 20, max 40 packets, mark-probability denominator 10; exponential weighting constant 9.
WRED_DEFAULT_PROFILE = (20, 40, 10)
# CoDel (RFC 8289, Nichols, Jacobson et al., 2018), its published constants: TARGET 5 ms of
# standing queue (§4.4) and INTERVAL 100 ms (§4.5, a worst-case RTT); Linux's `codel` qdisc
# uses the same defaults and a 1000-packet buffer limit (tc-codel(8)).
CODEL_TARGET_MS = 5.0
CODEL_INTERVAL_MS = 100.0
CODEL_LIMIT_PACKETS = 1000
WRED_WEIGHT_EXPONENT = 9
# IOS `random-detect` (precedence-based, the interface default): minimum thresholds for IP
# precedence 0-7, evenly spaced from half the maximum threshold (40) towards it; maximum 40
# and mark-probability denominator 10 for all. Cisco's command references say "half the
# max-threshold for precedence 0, the rest evenly spaced"; the exact numbers are the IOS 12.x
# default table as remembered (BRIEF §7), which that rule reproduces (20 + 20 p / 9, floored).
WRED_PRECEDENCE_MIN_THRESHOLDS = (20, 22, 24, 26, 28, 31, 33, 35)
WRED_MAX_THRESHOLD = 40
WRED_MARK_DENOMINATOR = 10

# --- The 2002 network (seed 000, Methods: 10 Mbit/s Ethernet, hubs) -----------------------
HUB_RATE_KBIT = 10_000        # a hub: one 10 Mbit/s half-duplex medium, both directions
HOST_CARD_RATE_KBIT = 10_000  # each workstation's 10 Mbit/s Ethernet card
HOST_CARD_QUEUE_PACKETS = 100  # the card's transmit FIFO: Linux 2.4's Ethernet txqueuelen (100);
                               # a best recollection of that era's default, no outside source

# --- Experiments -----------------------------------------------------------------------
# The study's workload (seed 000, BRIEF §2-3): the original C program analysed one image in ~5 s,
# on each site's two workstations (server X1 and worker X2); the competing wget processes
# fetched 20 MB files from the master in a loop.
STUDY_ANALYSIS_S = 5.0         # analysis time per image at a site, seconds
SITE_NODES = 2                 # a site's analysing nodes (its server and its worker)
FETCH_FILE_BYTES = 20_000_000  # one competing fetch (the study's 20 MB file)
EXPERIMENT_REPETITIONS = 10    # runs per cell of an experiment's matrix (the study's 10 runs)
# An adaptive experiment strategy (qos.experiment.spec.Adaptive) plans each case against its
# class's deadline (qos.policy.plan_site): step-down, hedging. Ours, not a source's: an
# intra-operative (urgent) answer within seconds; a class not listed plans against the
# workload's deadline_s.
CLASS_DEADLINES_S = {"urgent": 2.0, "routine": 10.0, "teaching": 60.0, "bulk": 120.0}
# The transfer workload's stand-in for a match's wire thumbnail (WIRE_THUMBNAIL_PX WebP: median
# 286 B, p90 384 B on the real Herlev cells, 236 B on the demo's; benchmarks/bench_wire_reply.py):
# the bytes each match carries back in an adaptive strategy's cases, unless the strategy says
# otherwise (its `thumbnail_bytes`; a strategy may ask 1000, the size before replies fitted one window).
WIRE_THUMBNAIL_BYTES = 300
MAX_WIRE_THUMBNAIL_BYTES = 65536  # the most a strategy may ask a transfer site for
# Linux's initial congestion window (RFC 6928: 10 segments), in TCP payload bytes at a 1500 B
# MTU with timestamps (1448 B a segment). tcp_slow_start_after_idle brings a warm connection
# that has been idle back to it, so a reply larger than this waits for a round trip of ACKs.
TCP_INITIAL_WINDOW_BYTES = 10 * 1448
# What a unary gRPC reply adds to its message on a warm connection: the 5 B message prefix,
# a 9 B HTTP/2 DATA frame header, and HPACK-indexed response headers and trailers (~60 B).
GRPC_REPLY_FRAMING_BYTES = 74

# --- Small site requests travel as copies (predictable completion) ----------------------------
# A site request of at most SMALL_REQUEST_BYTES (a features-mode case: ~1 KB a cell) is sent
# as SMALL_REQUEST_COPIES copies at once, each over its own already-open TCP connection to the
# site (a "lane"); the first answer wins and the other copies are cancelled. Behind a full
# drop-tail queue a lost segment stalls its connection for a retransmission timeout (>= 200 ms,
# Linux's minimum) or a tail-loss probe (2 RTT); an independent copy is stalled only if it is
# lost too. Connections are opened before the first case (no SYN, whose first retry waits 1 s,
# is sent at case time). Ours, measured in the testbed (qos/experiment/results/adaptive).
SMALL_REQUEST_BYTES = 16 * 1024
SMALL_REQUEST_COPIES = 3
# ... one after the other, COPY_GAP_S apart (copy k leaves k gaps after the first): a full
# drop-tail queue has a slot or two free at a time, so copies burst into it together meet the
# same full queue and are dropped together; a few ms apart each meets the queue afresh (it
# serves a 1500 B packet in 1.2 ms at 10 Mbit/s). Well under a round trip (~100 ms behind the
# testbed's full queue), the price when the first copy gets through.
COPY_GAP_S = 0.02
# Optionally, after a case, each class connection it used to a site is replaced by a fresh one,
# opened then and taken once ready (qos.transport.ClassChannels, `renew`): a connection that met
# losses keeps a congestion window of 2-5 segments for ever after, a new one sends 10 at once.
# Off: measured in the testbed (FIFO, 16 streams) it did not help, because a full drop-tail
# queue takes only the first segment of a burst whatever the window, and it hurt a one-segment
# request (a fresh connection's HPACK table is empty: ~250 B more headers, two segments).
RENEW_CONNECTIONS = False
# Fresh connections opened per renewed one, the first ready taken: a SYN lost behind a full
# queue is sent again only after 1 s, and cases may come sooner than that.
SPARE_CONNECTIONS = 2
# The end hosts' minimum TCP retransmission timeout (a strategy's `rto_min_ms`):
# Linux's is 200 ms (net.ipv4.tcp_rto_min_us = 200000), so a lost last segment of a tiny
# request waits >= 200 ms plus a round trip. An experiment may lower it on the coordinator's
# and the sites' hosts within these bounds, ms (the kernel accepts 1 us up; it recommends
# <= 200 ms; under ~4 ms a jiffy rounds it).
LINUX_RTO_MIN_MS = 200
RTO_MIN_MS_RANGE = (5, 200)
MAX_REQUEST_COPIES = 4         # more copies than this are refused in a configuration
# A site remembers the requests it has taken for COPY_MEMORY_S seconds (at most
# COPY_MEMORY_ENTRIES of them) and refuses a copy of one (qos.transport.CopyFilter): the
# copies cost the way there a few KB each, the way back one reply, not one per copy.
COPY_MEMORY_S = 120.0
COPY_MEMORY_ENTRIES = 4096

# --- What one cell may cost to analyse (pathmaster/budget.py) ---------------------------
# A Pap cell at the study's magnification is ~100-300 px a side (Herlev's largest crops are
# under 800 x 600), so a cell image over 1024 x 1024 is not a cell but a field of view. It
# is refused from its header, before decoding, with "crop the cell": features are in pixel
# units and database cells are cell-sized, so a downscaled field would not match anything
# anyway. (MAX_PIXELS above stays the limit for any image the core reads, e.g. at ingest.)
MAX_ANALYSIS_PIXELS = 1024 * 1024
# CPU time one cell's analysis may use: a floor plus a share per megapixel (a 1024 x 1024
# worst case measures ~3.5 s of CPU; a study cell ~0.3 s). Past it the worker process is
# killed and replaced, and that cell alone gets an error.
CELL_CPU_FLOOR_S = 5.0
CELL_CPU_PER_MEGAPIXEL_S = 10.0
# Wall-clock cap of one cell, as a multiple of its CPU budget: catches work that blocks
# without using CPU; generous, because a busy machine stretches wall time.
CELL_WALL_FACTOR = 6.0
# Address space of one analysis worker process (RLIMIT_AS): ~0.45 GiB is the libraries
# mapped (more in a Ray worker, whose fork server imports Ray too); a 1024 x 1024 cell peaks
# at ~0.25 GiB of RSS, the incident's 2048 x 2048 flat image at ~0.9 GiB, its 4096 x 4096 at
# 10.9 GB. A larger need is a MemoryError, an error for that cell alone.
ANALYSIS_MEMORY_BYTES = 3 * 1024**3
ANALYSIS_PROCESSES = 1     # bounded worker processes per analysing actor (one cell at a time)
# An analysis worker keeps the memory its arrays free (glibc mallopt, pathmaster.budget.
# keep_freed_memory) instead of handing it back to the kernel after every array: arrays up
# to ANALYSIS_MMAP_THRESHOLD_BYTES come from the heap, and up to ANALYSIS_TRIM_THRESHOLD_BYTES
# of freed heap stays mapped. glibc's defaults (dynamic thresholds from 128 kB) returned the
# ~1 MB temporaries of a 200 px cell's analysis to the kernel and faulted them back in: about
# a fifth of its CPU time (~40 -> ~33 ms, benchmarks/bench_features.py --sweep --sizes 200).
ANALYSIS_MMAP_THRESHOLD_BYTES = 32 * 1024**2   # glibc's own ceiling for the dynamic threshold
ANALYSIS_TRIM_THRESHOLD_BYTES = 64 * 1024**2   # at most this much freed memory kept per worker
# How often a cell's analysis looks whether its case was cancelled (the caller went away or
# its deadline passed): a cancelled cell's worker process is killed within about this long.
ANALYSIS_STOP_POLL_S = 0.1

# --- Identifiers a client chooses (checked at the coordinator, never echoed whole) -------
MAX_CASE_ID_CHARS = 64          # a case id, e.g. an accession number
MAX_CELL_ID_CHARS = 128         # a test cell's id: its file name, with a folder or two
MAX_NAME_CHARS = 64             # a request class or site name in a request
CASE_ID_CHARACTERS = "A-Za-z0-9._:-"    # a regular-expression character class
CELL_ID_CHARACTERS = "A-Za-z0-9._:/-"   # the same, and '/' for a folder part
ECHO_CHARS = 16                 # how much of a refused value an error message shows
MAX_CASE_DEADLINE_S = 3600.0    # a case's own deadline_s above this is refused

# --- Case log (the coordinator's completion records; mode 0600) ---------------------------

# --- Site vocabularies ------------------------------------------------------------------
MAX_VOCABULARY_LABELS = 256     # labels one site vocabulary may declare
