"""The core's defaults and limits: retrieval, image sizes, one cell's analysis budget, ids.

The upper layers keep their own constants beside the rule each one sets (the transport and
testbed in qos, the gateway, coordinator and sites in services). Units are in the names:
`_BYTES`, `_PIXELS`, `_S` (seconds).
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

# --- What one cell may cost to analyse (pathmaster/analysis/budget.py) ---------------------------
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
# An analysis worker keeps the memory its arrays free (glibc mallopt, pathmaster.analysis.budget.
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

# --- Site vocabularies ------------------------------------------------------------------
MAX_VOCABULARY_LABELS = 256     # labels one site vocabulary may declare
