"""The numbers the services agree on: ports, deadlines, limits, sizes.

Every server, client and command of `services` reads these from here, so that one value
has one home and a command's default is the value the server assumes. This module imports
nothing: the CLI reads it while it registers its flags, which must stay cheap.
"""

# ------------------------------------------------------------------ ports (deploy/README.md)
COORDINATOR_PORT = 50051   # the coordinator's control port (Info, Submit, health)
SITE_PORT = 50051          # a site's control port on its own host (Info, health)
GATEWAY_PORT = 8080        # the web page (`pathmaster gateway`)
OTLP_ENDPOINT = "http://localhost:4317"  # an OpenTelemetry collector's OTLP/gRPC port ([tracing] endpoint)

# ------------------------------------------------------------------ a case
QUERY_DEADLINE_S = 60.0    # a case's deadline when the client sets none (coordinator, query, client)
CASE_DEADLINE_S = 300.0    # the page and `pathmaster batch` cut off a case whose sites have not all answered by then
MAX_K = 100                # more matches per cell than this is refused (coordinator and sites)
DEFAULT_CLASS = "routine"  # the request class the coordinator takes for a case that names none

# ------------------------------------------------------------------ batches and the demo
BATCH_JOBS = 2             # cases `pathmaster batch` keeps in flight at once
BATCH_CASE_CELLS = 6       # cells per case `pathmaster batch` sends (a study case is 6 cells)
DEMO_CELLS = 140           # cells in each site database of `pathmaster demo` (7 diagnoses x 20)
WARM_UP_SEED = 7919        # the synthetic cell a site worker or analyser serves once at start,
                           # so the first case does not pay (nor teach the predictor) a fresh
                           # process's lazy imports and first search
