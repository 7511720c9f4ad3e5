"""One cell's analysis as it runs in a bounded worker process (pathmaster/budget.py).

`analyse_encoded` is what the site's Ray actor hands to its `AnalysisPool`: decode the
submitted bytes and extract features, in a process that is killed and replaced when the
cell goes over its CPU budget, its memory limit or its case's deadline. Only features and
two flags come back (search stays in the actor, which holds the FAISS index). This module
must stay light to import (no Ray, no gRPC): the pool's fork server preloads it.
"""

from __future__ import annotations

from services.site.cells import decode_cell

# Imported once by the pool's fork server, so a replacement worker starts without them.
PRELOAD = ("services.site.analysis", "pathmaster.site", "pathmaster.features", "pathmaster.segmentation")


def analyse_encoded(cell_id: str, image: bytes, background: bytes, mask: bytes):
    """Encoded cell parts -> (features float64 (n,), background_estimated, mask_estimated).
    Raises InvalidInput naming the cell for bad input."""
    from pathmaster.site import analyse_cell

    rgb, background_rgb, labels = decode_cell(cell_id, image, background, mask)
    analysis = analyse_cell(rgb, background_rgb, labels, source=f"cell {cell_id!r}")
    return analysis.features, bool(analysis.background_estimated), bool(analysis.mask_estimated)
