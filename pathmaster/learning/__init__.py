"""What a site learns from its own labelled cells, and the rules it learns by.

Modules: ``similarity`` (z-scores and the feature subset or axes a site compares),
``lens`` (the linear map a site fits on top of its eye), ``abnormality`` (logistic heads over
the features), ``policy`` (``LearntSimilarity``: what it compares and how it scores),
``choice`` (choosing them by inner cross-validation), ``neighbours`` (nearest, majority
vote, abnormal share), ``folds`` (folds by slide image), ``thresholds`` (operating points,
per cell and per case).
"""
