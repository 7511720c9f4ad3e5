"""One cell's analysis as it runs in a bounded worker process (pathmaster/analysis/budget.py).

`analyse_encoded` is what the site's Ray actor hands to its `AnalysisPool`: decode the
submitted bytes and extract features, in a process that is killed and replaced when the
cell goes over its CPU budget, its memory limit or its case's deadline. Only features and
two flags come back (search stays in the actor, which holds the FAISS index). This module
must stay light to import (no Ray, no gRPC): the pool's fork server preloads it.
"""

from __future__ import annotations

from services.cells import decode_cell

# What the pool's fork server imports (and, for WARM_MODULE, runs) once, so a replacement
# worker starts with all of it and its first cell costs what any other does.
WARM_MODULE = "services.warm_analysis"
PRELOAD = ("services.analysis", "pathmaster.analysis.cell", "pathmaster.features.extract",
           "pathmaster.image.segmentation", WARM_MODULE)


def analyse_encoded(cell_id: str, image: bytes, background: bytes, mask: bytes):
    """Encoded cell parts -> (features float64 (n,), background_estimated, mask_estimated).
    Raises InvalidInput naming the cell for bad input."""
    return analyse_encoded_cell(cell_id, image, background, mask)[:3]


def analyse_encoded_cell(cell_id: str, image: bytes, background: bytes, mask: bytes):
    """`analyse_encoded`, the cell's patch (uint8 (S, S, 3), what a site's learnt network
    embeds: ``pathmaster.analysis.cell.cell_patch``) as a fourth item, and the hash of its
    pixels (``database.image_hash``: a site finds the test cell among its own by it) as a fifth."""
    from pathmaster.analysis.cell import analyse_cell
    from pathmaster.site.database import image_hash

    rgb, background_rgb, labels = decode_cell(cell_id, image, background, mask)
    analysis = analyse_cell(rgb, background_rgb, labels, source=f"cell {cell_id!r}")
    return (analysis.features, bool(analysis.background_estimated), bool(analysis.mask_estimated), analysis.patch,
            image_hash(rgb))


def warm_up_analysis(seed: int = 0) -> None:
    """Analyse two small synthetic cells here, as `analyse_encoded` does in a worker: one
    as users send it (image only: segmented, slide estimated), one with its mask and slide.

    Run by the pool's fork server (`WARM_MODULE`) before it forks any worker. The first
    analysis in a process imports what the analysis code loads on first use (scikit-image's
    lazily loaded submodules, Pillow's image plugins, ...) and builds what is cached; done
    once in the server, every worker forked from it, including the one that replaces a
    worker killed by a hostile cell, inherits them and pays nothing for them.
    """
    from PIL import Image

    from pathmaster.image.io import encode_png
    from pathmaster.image.synth import cell_rng, synth_cell

    Image.init()  # every image plugin (a TIFF upload would load them all on first use)
    record = synth_cell("normal_intermediate", cell_rng(seed, 0))
    image = encode_png(record.image)
    analyse_encoded("warm-up", image, b"", b"")
    analyse_encoded("warm-up", image, encode_png(record.background), encode_png(record.mask))
