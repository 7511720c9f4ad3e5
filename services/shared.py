"""What the services agree on: ports, deadlines, limits, sizes, and how a match's
explanation is packed on the wire.

Every server, client and command of `services` reads these from here, so that one value
has one home, a command's default is the value the server assumes, and no server needs
another server's module for them. This module imports nothing but the standard library:
the CLI reads it while it registers its flags, which must stay cheap.
"""

from __future__ import annotations

import math

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

# ------------------------------------------------------------------ a match's explanation on the wire
# The site packs it (services/site/explain.py measures it), the page unpacks it, the page and
# the site both check the concept weights a refined search asks for.

# concept -> (the feature shown for it, prefixes of the features it is made of)
CONCEPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "nucleus_size": ("nucleus_area", ("nucleus_area", "nucleus_perimeter", "nucleus_major_axis",
                                      "nucleus_minor_axis", "nucleus_feret_")),
    "nc_ratio": ("nc_ratio", ("nc_ratio",)),
    "chromatin": ("nucleus_od_mean", ("nucleus_od_", "nucleus_brightness_", "nucleus_haralick_",
                                      "nucleus_lbp_")),
    "nucleus_shape": ("nucleus_form_factor", ("nucleus_form_factor", "nucleus_eccentricity", "nucleus_solidity",
                                              "nucleus_radial_cv", "nucleus_fourier_")),
    "cytoplasm": ("cell_area", ("cell_", "cytoplasm_")),
}
MAX_WEIGHT = 10.0  # a concept's weight when refining by concept: 0 (ignore it) to 10
# A shown value's ratio (match over test cell) outside 1/RELIABLE_RATIO..RELIABLE_RATIO says
# one of the two cells was segmented wrongly, not that they differ so: it is not shown.
RELIABLE_RATIO = 8.0
NO_RATIO = 10_000  # a packed log2 ratio (Match.measure_log2_ratio): the ratio is not reliable


def check_weights(weights) -> dict[str, float]:
    """`weights` ({concept: weight}) as a dict; ValueError naming a concept not in
    `CONCEPTS` or a weight outside 0..MAX_WEIGHT."""
    out = {}
    for concept, weight in dict(weights).items():
        if concept not in CONCEPTS:
            raise ValueError(f"no concept {concept[:40]!r}; the concepts are {', '.join(CONCEPTS)}")
        if not 0.0 <= float(weight) <= MAX_WEIGHT:
            raise ValueError(f"the weight of {concept} must be 0 to {MAX_WEIGHT:g}, not {weight}")
        out[concept] = float(weight)
    return out


UNMEASURED = 255  # a packed share: the site was not sent the concept's shown feature


def pack(measures: list[dict]) -> tuple[list[int], list[int]]:
    """`Explainer.measures` as the wire's packed fields (Match.measure_log2_ratio,
    Match.measure_share), one value per concept in `CONCEPTS` order."""
    by_concept = {m["concept"]: m for m in measures}
    ratios, shares = [], []
    for concept in CONCEPTS:
        m = by_concept.get(concept)
        if m is None or not (m["query"] > 0 and m["match"] > 0):
            ratios.append(0)
            shares.append(UNMEASURED)
            continue
        ratios.append(round(100 * math.log2(m["match"] / m["query"])) if reliable(m["query"], m["match"])
                      else NO_RATIO)
        shares.append(min(100, round(100 * m["share"])))
    return ratios, shares


def reliable(query: float, match: float) -> bool:
    """Whether a shown feature's two raw values can be compared as a ratio: both positive
    and finite, and within RELIABLE_RATIO of each other."""
    if not (math.isfinite(query) and math.isfinite(match) and query > 0 and match > 0):
        return False
    return 1 / RELIABLE_RATIO <= match / query <= RELIABLE_RATIO


def unpack(ratios, shares) -> list[dict]:
    """The packed fields as [{"concept", "ratio" (match over test cell; None where it is not
    reliable), "share" (0..1)}], largest share first, concepts the site did not measure left out."""
    out = [{"concept": concept, "ratio": None if r == NO_RATIO else round(2 ** (r / 100), 3), "share": s / 100}
           for concept, r, s in zip(CONCEPTS, ratios, shares) if s != UNMEASURED]
    return sorted(out, key=lambda m: -m["share"])
