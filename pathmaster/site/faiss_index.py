"""FAISS search indexes over a site's vectors.

``build_index(vectors, algorithm)``: exact (``"flat"``) by default, ``"ivf"`` or ``"hnsw"``
for large sites (``ALGORITHMS``; exact up to ``EXACT_LIMIT`` cells), with ``tune_nprobe``
measuring recall against exact search. All vectors handed to FAISS are float32,
C-contiguous. Distances returned by ``search`` are Euclidean (not squared) in the site's
space: unitless, smaller is closer.
"""

from __future__ import annotations

import math

import numpy as np

from pathmaster import defaults

ALGORITHMS = ("flat", "ivf", "hnsw")
# Below this many cells exact search is well under a millisecond; above it the site
# builder switches to IVF (measured in benchmarks/bench_search.py).
EXACT_LIMIT = 200_000


# ---------------------------------------------------------------- FAISS indexes


def default_nlist(n_vectors: int) -> int:
    """IVF list count: about 4 x sqrt(n), at least 1, and at most n / 39 so that
    k-means has the ~39 training points per centroid FAISS asks for."""
    return int(max(1, min(4 * math.sqrt(n_vectors), n_vectors // 39)))


def build_index(
    vectors: np.ndarray,
    algorithm: str = "flat",
    *,
    nlist: int | None = None,
    hnsw_m: int = 32,
    train_size: int | None = None,
    seed: int = 0,
):
    """A FAISS index over ``vectors`` (float32, (n, d)) using squared-L2 distance.

    algorithm: ``"flat"`` exact search (IndexFlatL2); ``"ivf"`` inverted lists over a
    k-means coarse quantizer (IndexIVFFlat, trained on a sample of ``train_size`` vectors,
    by default max(100k, 40 per list) as k-means needs; set ``index.nprobe``, e.g. with
    ``tune_nprobe``); ``"hnsw"`` a navigable small-world
    graph (IndexHNSWFlat with ``hnsw_m`` links; ``index.hnsw.efSearch`` sets its recall).
    Row i of ``vectors`` gets FAISS id i.
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] == 0:
        raise ValueError(f"need a 2-D array of vectors with at least one column, got {vectors.shape}")
    n, d = vectors.shape
    if algorithm == "flat":
        index = faiss.IndexFlatL2(d)
    elif algorithm == "ivf":
        nlist = nlist or default_nlist(n)
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_L2)
        index.cp.seed = seed
        # 10 k-means iterations instead of 25: the lists only route the search, and the
        # recall actually reached is measured (tune_nprobe), so a coarser k-means costs a
        # little nprobe, not correctness, and builds a 1M-vector site 2.5x faster.
        index.cp.niter = 10
        sample = vectors
        train_size = train_size or max(100_000, 40 * nlist)
        if n > train_size:
            sample = vectors[np.random.default_rng(seed).choice(n, train_size, replace=False)]
        index.train(sample)
        index.nprobe = min(nlist, 8)
    elif algorithm == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m)
        index.hnsw.efSearch = 64
    else:
        raise ValueError(f"unknown search algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if n:
        index.add(vectors)
    return index


def search(index, queries: np.ndarray, k: int = defaults.K) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of each query row: (distances float32 (m, k), ids int64 (m, k)).

    Distances are Euclidean (square root of FAISS's squared L2). Where the index holds
    fewer than k vectors the missing slots have id -1 and distance inf.
    """
    queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    sq, ids = index.search(queries, k)
    dist = np.sqrt(np.maximum(sq, 0.0))
    dist[ids < 0] = np.inf
    return dist, ids


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Fraction of the exact top-k ids that the approximate top-k also returned (mean over queries)."""
    approx_ids, exact_ids = np.atleast_2d(approx_ids), np.atleast_2d(exact_ids)
    hits = sum(len(np.intersect1d(a[a >= 0], e[e >= 0])) for a, e in zip(approx_ids, exact_ids))
    total = int((exact_ids >= 0).sum())
    return hits / total if total else 1.0


def nprobe_steps(nlist: int) -> list[int]:
    """Candidate nprobe values: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (steps of about x1.5) up to nlist."""
    steps, value = [], 1
    while value < nlist:
        steps += [value, value * 3 // 2] if value >= 2 else [value]
        value *= 2
    return sorted({v for v in steps if v < nlist} | {nlist})


def tune_nprobe(index, queries: np.ndarray, exact_ids: np.ndarray, k: int = defaults.K, target_recall: float = 0.95,
                exclude: np.ndarray | None = None) -> tuple[int, float]:
    """Smallest ``nprobe`` of ``nprobe_steps`` whose recall@k against ``exact_ids`` reaches the target.

    exact_ids: (m, k) exact top-k of each query, or (m, k + 1) when ``exclude`` gives one id
    per query to leave out of both rankings (a database vector used as a query would
    otherwise always "find" itself and inflate the recall).
    Sets ``index.nprobe`` to it and returns (nprobe, recall measured). Probing every list
    (nprobe = nlist) makes IVF-Flat exact, so the search always ends.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    exact_ids = drop_ids(exact_ids, exclude, k)
    for nprobe in nprobe_steps(index.nlist):
        index.nprobe = nprobe
        _, ids = index.search(queries, k if exclude is None else k + 1)
        recall = recall_at_k(drop_ids(ids, exclude, k), exact_ids)
        if recall >= target_recall:
            break
    return nprobe, recall


def drop_ids(ids: np.ndarray, exclude: np.ndarray | None, k: int) -> np.ndarray:
    """Each row of ``ids`` without its ``exclude`` id (if present), cut to k columns."""
    if exclude is None:
        return ids[:, :k]
    return np.array([[i for i in row if i != skip][:k] for row, skip in zip(ids, exclude)])


def describe(index) -> str:
    """A short, stable name of the index kind and its search setting, e.g. ``faiss-ivf1024-nprobe16``."""
    import faiss

    if isinstance(index, faiss.IndexIVF):
        return f"faiss-ivf{index.nlist}-nprobe{index.nprobe}"
    if isinstance(index, faiss.IndexHNSW):
        return f"faiss-hnsw{index.hnsw.nb_neighbors(1)}-ef{index.hnsw.efSearch}"
    return "faiss-flat-l2"
