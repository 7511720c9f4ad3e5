"""Every default and limit of the project, in one place.

Each layer reads its defaults from here (the core, the QoS transport and testbed, the
services and clients), so a value is typed once and a change is made once. Units are in
the names: `_BYTES`, `_PIXELS`, `_S` (seconds), `_PACKETS`, `_BPS` (bits per second).
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

# --- Services --------------------------------------------------------------------------
COORDINATOR_PORT = 50051   # the coordinator's control port (Info, Submit, health)
SITE_PORT = 50051          # a site's control port on its own host (testbed deployments)
CASE_DEADLINE_S = 300.0    # a case whose sites have not all answered by then is cut off

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
ANALYSIS_WORKERS = 1       # worker processes per site worker (it analyses one cell at a time)
