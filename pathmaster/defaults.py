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
MAX_K = 100           # more matches per cell than this is refused

# --- Client-chosen sizes (every one bounded) ------------------------------------------
MAX_IMAGE_BYTES = 16 * 1024 * 1024   # one encoded file; a study cell is ~100 KB
MAX_PIXELS = 4096 * 4096             # one image; checked from the header, before decoding

MAX_FILE_BYTES = 8 * 1024 * 1024     # one uploaded file (page, batch); room for uncompressed TIFFs
MAX_CASE_CELLS = 64                  # cells per case (coordinator, page); more is a batch
MAX_CASE_BYTES = 64 * 1024 * 1024    # one case's images together, at the coordinator
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # one HTTP request body at the gateway (base64 files)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # one gRPC message, either way (QoS transport)

# --- Services --------------------------------------------------------------------------
COORDINATOR_PORT = 50051   # the coordinator's control port (Info, Submit, health)
SITE_PORT = 50051          # a site's control port on its own host (testbed deployments)
CLASS_PORT_BASE = 50061    # a site's fixed per-class reply ports: this one, +1, ... by priority
GATEWAY_PORT = 8080        # the web page (`pathmaster gateway`)
CASE_DEADLINE_S = 300.0    # a case whose sites have not all answered by then is cut off
QUERY_DEADLINE_S = 60.0    # a case's deadline when the client sets none (coordinator, query, client)
DEPLOY_TIMEOUT_S = 300.0   # deploying PathMaster in the testbed (Ray, sites, coordinator) must end by then
BATCH_JOBS = 2             # cases `pathmaster batch` keeps in flight at once
BATCH_CASE_CELLS = 6       # cells per case `pathmaster batch` sends (a study case is 6 cells)
STATS_WINDOW_CASES = 1000  # completion times the coordinator keeps per class for its statistics
DEMO_CELLS = 140           # cells in each site database of `pathmaster demo` (7 diagnoses x 20)
SITE_RESOURCE_PER_WORKER = 0.001  # of a site's Ray placement resource (a node that holds its
                                  # database offers 1), asked by each of its actors and index builds:
                                  # it pins them to that node without limiting how many run there

# --- Replies sized for the wire -----------------------------------------------------------
WIRE_THUMBNAIL_PX = 48     # a match's inline thumbnail (JPEG, ~1 KB); full images on demand

# --- Coordinator: own analysis and admission (qos.admission) ---------------------------------
COORDINATOR_ANALYSERS = 2       # Ray actors analysing each case's cells once at the coordinator
ANALYSIS_READY_S = 120.0        # how long the coordinator waits for them before images-only
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
# Cisco IOS weighs a WFQ flow by IP precedence + 1: AF41 -> 5, AF21 -> 3, AF11 -> 2, LE -> 1.
WFQ_WEIGHTS = {"urgent": 5, "routine": 3, "teaching": 2, "bulk": 1}
SHAPER_BURST_BYTES = 3028      # token bucket of a shaped class: two full Ethernet frames (2 x 1514)
# WRED (Cisco IOS `random-detect`): the profile of a DSCP with no profile of its own is
# min 20, max 40 packets, mark-probability denominator 10; exponential weighting constant 9.
WRED_DEFAULT_PROFILE = (20, 40, 10)
WRED_WEIGHT_EXPONENT = 9

# --- Experiments -----------------------------------------------------------------------
EXPERIMENT_REPETITIONS = 10    # runs per cell of an experiment's matrix (the study's 10 runs)

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

# --- Identifiers a client chooses (checked at the coordinator, never echoed whole) -------
MAX_CASE_ID_CHARS = 64          # a case id, e.g. an accession number
MAX_CELL_ID_CHARS = 128         # a test cell's id: its file name, with a folder or two
MAX_NAME_CHARS = 64             # a request class or site name in a request
MAX_CASE_SITES = 256            # site names one case may list
CASE_ID_CHARACTERS = "A-Za-z0-9._:-"    # a regular-expression character class
CELL_ID_CHARACTERS = "A-Za-z0-9._:/-"   # the same, and '/' for a folder part
ECHO_CHARS = 16                 # how much of a refused value an error message shows
MAX_CASE_DEADLINE_S = 3600.0    # a case's own deadline_s above this is refused

# --- Case log (the coordinator's completion records; mode 0600) ---------------------------
CASE_LOG_MAX_BYTES = 64 * 1024 * 1024   # then it is rotated to .1, .2, ...
CASE_LOG_BACKUPS = 5                    # rotated files kept

# --- Site vocabularies ------------------------------------------------------------------
MAX_VOCABULARY_LABELS = 256     # labels one site vocabulary may declare
