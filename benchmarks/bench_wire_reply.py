"""Reply bytes per site of a features-mode case: do a site's matches fit in one initial
congestion window?

    python benchmarks/bench_wire_reply.py [--cells 6] [--cases 20] [--seed 0]

A site answers a 6-cell case with 6 x K matches, each with its ids, diagnosis, Bethesda
term, distance, the SHA-256 of its full image and an inline thumbnail. Behind a full
drop-tail queue a reply of more than one initial congestion window (Linux: 10 segments of
1448 B payload = 14480 B, restored after an idle warm connection by
tcp_slow_start_after_idle) needs a second round trip whose ACKs cross the same queue.

For each demo site database (built by `pathmaster demo` or bench_predictable.py, under the
cache; skipped when absent) and for the real Herlev cells in ../shared/data/herlev-40px
(when present), `--cases` cases of random matches are made into the site's wire reply
(`services.site.server.cell_result`, as the site sends it), with the thumbnails encoded as
before (48 px JPEG quality 80) and as now (`services.site.worker.WIRE_THUMBNAIL_*`), side by side.
Printed per source: thumbnail bytes (median, p90), reply message bytes (median, max) and the
TCP segments of the whole gRPC response (message + 5 B gRPC prefix + 9 B HTTP/2 DATA frame
header + ~60 B response headers and trailers on a warm HPACK context), and the share of
cases that fit in 10 segments. Also the fidelity of each encoding: PSNR (dB) against the
lossless thumbnail of the same size.

Measured (commit 5e7c30e, --cases 20): reply bytes a site, median (max), before -> now:
demo connecticut 22,655 (23,346) -> 11,388 (11,654); new-york 22,632 (23,007) -> 11,452
(11,856); california 22,686 (23,243) -> 11,254 (11,674); Herlev 40 px (real cells) 23,638
(24,248) -> 13,454 (14,255) B, i.e. 16-17 -> 8-10 segments, one initial window in every
case now, in none before. Thumbnails median 608-627 B (JPEG q80) -> 231-286 B (WebP q80),
PSNR 37.4-37.6 -> 37.5 dB (demo) / 36.5 dB (Herlev).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MSS_BYTES = 1448            # TCP payload per segment on a 1500 B MTU path with timestamps
HERLEV = REPO.parent / "shared" / "data" / "herlev-40px"


def demo_sources() -> dict[str, list[tuple[str, str, str, str, bytes]]]:
    """{source: [(cell_id, diagnosis, bethesda, source_id, thumbnail PNG)]} of each cached demo site."""
    from pathmaster.site.search import SiteIndex
    from services.demo import DEMO_SITES
    from services.synthetic import cache_root

    out = {}
    for site in DEMO_SITES:
        folders = sorted((cache_root() / "demo").glob(f"{site.name}-seed{site.seed}-*cells"))
        if not folders:
            continue
        index = SiteIndex.open(folders[0])
        rows = []
        for cell_id in index.cell_ids():
            cell = index.cell(cell_id)
            rows.append((cell_id, cell.diagnosis or "", index.vocabulary.to_bethesda(cell.diagnosis) or "",
                         cell.source_id, index.thumbnail_png(cell_id), hashlib.sha256(index.image_png(cell_id)).hexdigest()))
        out[f"demo {site.name}"] = rows
    return out


def herlev_source() -> dict[str, list]:
    """The real Herlev cells (40 px), as a site of them would store and name them."""
    from PIL import Image

    from pathmaster.site.database import cell_id_for

    rows = []
    for path in sorted(HERLEV.glob("*/*.BMP")):
        if path.stem.endswith("-d"):
            continue
        buffer = io.BytesIO()
        Image.open(path).convert("RGB").save(buffer, format="PNG")
        source_id = f"herlev/{path.parent.name}/{path.name}"
        rows.append((cell_id_for(source_id), path.parent.name, "", source_id, buffer.getvalue(),
                     hashlib.sha256(buffer.getvalue()).hexdigest()))
    return {"herlev-40px (real)": rows} if rows else {}


def psnr_db(png: bytes, encoded: bytes, size: int) -> float:
    """PSNR of an encoded thumbnail against the lossless one of the same size."""
    from PIL import Image

    reference = Image.open(io.BytesIO(png)).convert("RGB")
    reference.thumbnail((size, size), Image.Resampling.LANCZOS)
    a = np.asarray(reference, dtype=float)
    b = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"), dtype=float)
    return float(10 * np.log10(255.0 ** 2 / max(((a - b) ** 2).mean(), 1e-12)))


def segments(message_bytes: int) -> int:
    from qos.network import GRPC_REPLY_FRAMING_BYTES

    return math.ceil((message_bytes + GRPC_REPLY_FRAMING_BYTES) / MSS_BYTES)


def main(argv=None) -> None:
    from pathmaster import defaults
    from qos.network import TCP_INITIAL_WINDOW_BYTES
    from services.site.worker import WIRE_THUMBNAIL_FORMAT, WIRE_THUMBNAIL_PX, WIRE_THUMBNAIL_QUALITY
    from pathmaster.image.io import wire_thumbnail
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.server import cell_result
    from services.site.worker import CellOutcome
    from pathmaster.site.search import Match

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=6)
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    encodings = {"before: JPEG q80": ("JPEG", 80),
                 f"now: {WIRE_THUMBNAIL_FORMAT} q{WIRE_THUMBNAIL_QUALITY}":
                 (WIRE_THUMBNAIL_FORMAT, WIRE_THUMBNAIL_QUALITY)}
    px = WIRE_THUMBNAIL_PX
    window_segments = TCP_INITIAL_WINDOW_BYTES // MSS_BYTES
    sources = demo_sources() | herlev_source()
    if not sources:
        sys.exit("no demo site database in the cache and no ../shared/data/herlev-40px: nothing to measure")
    rng = np.random.default_rng(args.seed)
    print(f"{args.cells}-cell case, K={defaults.K}: {args.cells * defaults.K} matches a site; "
          f"{px} px thumbnails; one initial window = {window_segments} x {MSS_BYTES} B")
    for source, rows in sources.items():
        print(f"\n{source} ({len(rows)} cells)")
        for label, (fmt, quality) in encodings.items():
            thumbs = {row[0]: wire_thumbnail(row[4], px, quality, fmt) for row in rows}
            fidelity = [psnr_db(row[4], thumbs[row[0]], px) for row in rows]
            replies = []
            for _ in range(args.cases):
                picks = rng.choice(len(rows), size=(args.cells, defaults.K), replace=len(rows) < args.cells * defaults.K)
                cells = []
                for c, pick in enumerate(picks):
                    chosen = [rows[i] for i in pick]
                    outcome = CellOutcome(
                        f"cell{c}", tuple(Match(r[0], r[1], float(rng.uniform(0, 10)), r[3]) for r in chosen),
                        tuple(thumbs[r[0]] for r in chosen), tuple(r[5] for r in chosen), tuple(r[2] for r in chosen))
                    cells.append(cell_result(outcome))
                reply = pb.AnalyseReply(site="new-york", algorithm="features", cells=cells, database_cells=len(rows),
                                        timing=pb.SiteTiming(site_wall_s=0.01, queue_s=0.001, search_s=0.005))
                replies.append(reply.ByteSize())
            sizes = sorted(len(t) for t in thumbs.values())
            fits = sum(segments(r) <= window_segments for r in replies) / len(replies)
            print(f"  {label:18s} thumbnail median {statistics.median(sizes):5.0f} B p90 {sizes[int(0.9 * len(sizes))]:5d} B "
                  f"PSNR median {statistics.median(fidelity):4.1f} dB | reply median {statistics.median(replies):6.0f} B "
                  f"max {max(replies):6d} B = {segments(int(statistics.median(replies)))}-{segments(max(replies))} segments; "
                  f"fits one initial window: {fits:.0%}")


if __name__ == "__main__":
    main()
