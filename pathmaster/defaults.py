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
