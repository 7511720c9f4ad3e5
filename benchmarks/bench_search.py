"""Search speed: top-5 over 10k cells (exact) and over 1M vectors (IVF vs exact, with recall).

    python benchmarks/bench_search.py            # 10k exact + 1M IVF (a few minutes, ~1.5 GB RAM)
    python benchmarks/bench_search.py --quick    # 10k exact + 100k IVF

Queries are timed one at a time (the site searches per test cell) with FAISS on one
thread, and the median is printed; goals: <= 1 ms per query for both, recall@5 >= 0.95
against exact for IVF. The vectors imitate z-scored cell features: a mixture of 7 classes
x 20 modes whose spread lies mostly in a 16-dimensional subspace (real feature vectors are
strongly correlated), plus isotropic noise. d = 115, the full feature vector (the worst
case; a selected subset is shorter).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import faiss
import numpy as np

from pathmaster.site import faiss_index


def feature_like_vectors(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """n float32 vectors of dimension d: 140 Gaussian modes in a correlated 16-D latent space."""
    latent_dim, modes = 16, 140
    mixing = rng.normal(0, 1 / np.sqrt(latent_dim), size=(latent_dim, d))
    centres = rng.normal(0, 1.5, size=(modes, latent_dim))
    out = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, 100_000):  # in chunks to bound memory
        m = min(100_000, n - start)
        latent = centres[rng.integers(0, modes, m)] + rng.normal(0, 0.6, size=(m, latent_dim))
        out[start:start + m] = latent @ mixing + rng.normal(0, 0.15, size=(m, d))
    return out


def median_query_ms(index, queries: np.ndarray, k: int = 5) -> float:
    """Median wall time of one single-vector search, in ms."""
    times = []
    for q in queries:
        t0 = time.perf_counter()
        index.search(q[None, :], k)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k vectors for the IVF part instead of 1M")
    parser.add_argument("--dim", type=int, default=115)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings are medians; "
          "compare ratios measured in this run)")
    rng = np.random.default_rng(args.seed)
    d = args.dim

    # ---- 10k cells, exact
    base = feature_like_vectors(10_000, d, rng)
    queries = feature_like_vectors(1000, d, rng)
    exact = faiss_index.build_index(base, "flat")
    ms = median_query_ms(exact, queries)
    t0 = time.perf_counter()
    exact.search(queries, 5)
    batch_ms = 1e3 * (time.perf_counter() - t0) / len(queries)
    print(f"exact top-5 over 10,000 x {d}: median {ms:.3f} ms/query (goal <= 1 ms: {'met' if ms <= 1 else 'NOT met'}); "
          f"batched {batch_ms:.3f} ms/query")

    # ---- 1M vectors, IVF against exact
    n = 100_000 if args.quick else 1_000_000
    t0 = time.perf_counter()
    base = feature_like_vectors(n, d, rng)
    tune, test = feature_like_vectors(500, d, rng), feature_like_vectors(500, d, rng)
    print(f"generated {n:,} x {d} vectors in {time.perf_counter() - t0:.1f} s")
    faiss.omp_set_num_threads(2)  # building and ground truth are batch work
    t0 = time.perf_counter()
    exact = faiss_index.build_index(base, "flat")
    _, truth_tune = exact.search(tune, 5)
    _, truth_test = exact.search(test, 5)
    print(f"exact ground truth for 1000 queries in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    ivf = faiss_index.build_index(base, "ivf", seed=args.seed)
    build_s = time.perf_counter() - t0
    nprobe, tune_recall = faiss_index.tune_nprobe(ivf, tune, truth_tune, 5, 0.95)
    faiss.omp_set_num_threads(1)
    _, found = ivf.search(test, 5)
    recall = faiss_index.recall_at_k(found, truth_test)
    ivf_ms = median_query_ms(ivf, test)
    exact_ms = median_query_ms(exact, test[:30])
    print(f"IVF nlist={ivf.nlist} built (train + add) in {build_s:.1f} s; nprobe chosen {nprobe} "
          f"(recall@5 {tune_recall:.3f} on 500 tuning queries)")
    print(f"IVF top-5 over {n:,}: median {ivf_ms:.3f} ms/query, recall@5 {recall:.3f} on 500 other queries "
          f"(goal <= 1 ms at recall >= 0.95: {'met' if ivf_ms <= 1 and recall >= 0.95 else 'NOT met'})")
    print(f"exact top-5 over {n:,}: median {exact_ms:.2f} ms/query; IVF speed-up x{exact_ms / ivf_ms:.0f}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
