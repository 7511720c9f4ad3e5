"""A site: its database of cells, its search index and what it learnt, and the facade the
services use.

Modules: ``database`` (one SQLite file: cells, images, settings), ``ingest`` (adding a
dataset's cells, analysed in parallel), ``fitting`` (what the site learns from its cells when
indexed), ``index`` (building and storing the search index), ``faiss_index`` (FAISS),
``growth`` (a site that grows without learning again), ``search`` (``SiteIndex``: which
cells look like this one).
"""
