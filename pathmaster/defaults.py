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
