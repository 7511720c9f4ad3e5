"""Pictures of cells: reading and checking them, their optics, morphology and segmentation,
and synthetic cells.

Modules: ``io`` (decode and check image bytes and files, PNG out), ``optics`` (optical
density against the blank slide), ``morphology`` (smoothing, labelling, morphology,
thresholds), ``segmentation`` (the 4-region mask and the blank slide when none is given),
``synth`` (deterministic synthetic Pap cells).
"""
