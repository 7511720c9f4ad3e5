"""Batch teaching-set queries: hundreds of cells through the coordinator, into a file.

    pathmaster batch DIR --class teaching --out results.csv   (or .jsonl)

DIR holds cell images, each optionally with NAME-background.* and NAME-mask.* beside it
(the page's pairing rule). A cell inside a folder named after a diagnosis (DIR/mild_dysplasia/
7.png, or Herlev's DIR/light_dysplastic/7.BMP with its colour mask 7-d.bmp) carries that label, and the summary gives per-class accuracy of the voted diagnosis.

Cells go in cases of `case_size`, at most `jobs` cases in flight. Every finished case is
appended to the output at once, one row per cell, so a run that stops can be resumed:
cells whose last row is "ok" or "invalid" are skipped; "failed" ones (no site answered)
are tried again. The summary is computed from the whole file, this run and earlier ones.

One row per cell (CSV columns = JSON keys): cell (its path under DIR without extension),
label, diagnosis (voted across sites), votes/total, correct, bethesda (the cell's Bethesda
term: most of its matches, a tie to the more severe), bethesda_spread ("HSIL 9/15, LSIL
5/15"), supports (the abnormality the cell supports under the case rule, "" none),
case_conclusion and case_outcome (the conclusion of the case the cell was sent in, in words
and as its code; `services.conclusion_words`), status (ok | failed | invalid), error,
sites_ok/sites_failed, mask_estimated/background_estimated (a site had to make them: none
was given), request_class, case_id, case_s (the case's
completion time at the coordinator) and matches ({site: [[cell_id, diagnosis, distance,
bethesda, similarity], ...]} closest first, the distance in the site's own scale, the
similarity the site's calibrated one, 0..1, comparable between sites; a JSON string in the CSV).
"""

from __future__ import annotations

import csv
import io
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import grpc

from pathmaster.importers import herlev
from pathmaster.records import ALL_DIAGNOSES, InvalidInput, diagnosis_from_name
from qos.transport import TLSFiles
from services.client import CoordinatorClient
from services.conclusion_words import headline, spread_text
from services.shared import BATCH_CASE_CELLS, BATCH_JOBS, CASE_DEADLINE_S
from services.gateway.events import status_name
from services.gateway.pairing import IMAGE_EXTENSIONS, CellFiles, mask_labels, pair_files
from services.gateway.upload import MAX_FILE_BYTES, cell_problem
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

COLUMNS = ("cell", "label", "diagnosis", "votes", "total", "correct", "bethesda", "bethesda_spread",
           "supports", "case_conclusion", "case_outcome", "status", "error",
           "sites_ok", "sites_failed", "mask_estimated", "background_estimated",
           "request_class", "case_id", "case_s", "matches")
DONE_STATUSES = ("ok", "invalid")  # "failed" rows are tried again on resume
FORMATS = (".csv", ".jsonl")


@dataclass
class BatchCell:
    """One cell of the teaching set: its files (paths relative to the root) and label.

    `herlev_mask`: the mask is a Herlev colour-coded NAME-d.bmp (path in `files.mask`),
    turned into 0-3 labels before it is sent.
    """

    files: CellFiles
    label: str | None
    herlev_mask: bool = False

    @property
    def cell_id(self) -> str:
        return self.files.cell_id


@dataclass
class BatchSummary:
    """What a batch did. `rows` holds the final row of every cell in the output file."""

    out: Path
    cells: int = 0          # cells found in DIR
    skipped: int = 0        # already done by an earlier run
    run: int = 0            # sent (or checked and refused) in this run
    elapsed_s: float = 0.0
    problems: list[tuple[str, str]] = field(default_factory=list)  # files that do not pair
    rows: dict[str, dict] = field(default_factory=dict)

    @property
    def cells_per_s(self) -> float:
        return self.run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def status_counts(self) -> Counter:
        return Counter(row["status"] for row in self.rows.values())

    def accuracy(self) -> dict[str, tuple[int, int]]:
        """label -> (correct, answered) over labelled cells with a voted diagnosis; key "all"
        for every label together."""
        table: dict[str, list[int]] = {}
        for row in self.rows.values():
            if row["label"] and row["status"] == "ok" and row["diagnosis"]:
                for key in (row["label"], "all"):
                    counts = table.setdefault(key, [0, 0])
                    counts[0] += row["diagnosis"] == row["label"]
                    counts[1] += 1
        return {k: (c, n) for k, (c, n) in table.items()}

    def format(self) -> str:
        """The summary a person reads at the end of a run."""
        counts = self.status_counts()
        lines = [
            f"batch: {self.cells} cells in the set, {self.skipped} already done, "
            f"{self.run} run now in {self.elapsed_s:.1f} s ({self.cells_per_s:.2f} cells/s)",
            f"results in {self.out}: {counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed "
            f"(run again to retry), {counts.get('invalid', 0)} invalid input",
        ]
        for name, problem in self.problems:
            lines.append(f"  left out {name}: {problem}")
        failed = [r for r in self.rows.values() if r["status"] != "ok"]
        for row in failed[:10]:
            lines.append(f"  {row['status']} {row['cell']}: {row['error']}")
        if len(failed) > 10:
            lines.append(f"  ... and {len(failed) - 10} more (see the output file)")
        accuracy = self.accuracy()
        if accuracy:
            lines.append("accuracy of the diagnosis voted across sites, by true class:")
            width = max(len(k) for k in accuracy)
            ordered = [d for d in ALL_DIAGNOSES if d in accuracy] + ["all"]
            for key in ordered:
                correct, n = accuracy[key]
                lines.append(f"  {key:<{width}}  {correct:4d}/{n:<4d} {100.0 * correct / n:5.1f}%")
        return "\n".join(lines)


# ---------------------------------------------------------------- finding the cells

def find_cells(root: str | Path) -> tuple[list[BatchCell], list[tuple[str, str]]]:
    """The cells under `root` (all depths), paired by name, with labels from class folders.

    Returns (cells sorted by id, problems: (file, reason) for image files that do not pair).
    Files whose extension is not an image type (manifests, notes) are ignored silently.
    A cell's label is the diagnosis its folder is named after (our names, or Herlev's and
    SIPaKMeD's, e.g. light_dysplastic), else None. In a Herlev folder (`herlev.looks_like`)
    NAME-d.bmp is NAME's colour-coded mask.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a folder of cell images")
    names = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*"))
             if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
    herlev_masks = {}  # NAME-mask.bmp (what pairing sees) -> NAME-d.bmp (the file)
    if herlev.looks_like(root):
        for name in names:
            path = PurePosixPath(name)
            if path.stem.endswith(herlev.MASK_SUFFIX) and path.suffix.lower() == ".bmp":
                stem = path.stem.removesuffix(herlev.MASK_SUFFIX)
                herlev_masks[str(path.with_name(f"{stem}-mask{path.suffix}"))] = name
    pairing = pair_files([n for n in names if n not in herlev_masks.values()] + list(herlev_masks))
    cells = []
    for files in pairing.cells:
        herlev_mask = files.mask in herlev_masks
        if herlev_mask:
            files.mask = herlev_masks[files.mask]
        cells.append(BatchCell(files=files, label=_label(PurePosixPath(files.image).parent.name),
                               herlev_mask=herlev_mask))
    return cells, pairing.problems


def _label(folder: str) -> str | None:
    try:
        return diagnosis_from_name(folder) if folder else None
    except InvalidInput:
        return None


# ---------------------------------------------------------------- the output file

class ResultsFile:
    """The output: CSV or JSON lines (by suffix), appended one case at a time, resumable."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.kind = self.path.suffix.lower()
        if self.kind not in FORMATS:
            raise ValueError(f"{self.path}: the output must end in .csv or .jsonl")
        self._lock = threading.Lock()

    def read(self) -> dict[str, dict]:
        """cell id -> its last row. A torn last line (a run killed mid-write) is cut off."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return {}
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            self.path.write_bytes(data)
        text = data.decode("utf-8")
        if self.kind == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            reader = csv.DictReader(io.StringIO(text))
            if reader.fieldnames and tuple(reader.fieldnames) != COLUMNS:
                raise ValueError(f"{self.path}: its columns are not a batch's results "
                                 f"({', '.join(reader.fieldnames)}); choose another --out")
            rows = [self._from_csv(r) for r in reader]
        return {row["cell"]: row for row in rows}

    @staticmethod
    def _from_csv(row: dict) -> dict:
        out = dict(row)
        for key in ("votes", "total", "sites_ok", "sites_failed"):
            out[key] = int(row[key]) if row[key] else 0
        out["case_s"] = float(row["case_s"]) if row["case_s"] else 0.0
        for key in ("correct", "mask_estimated", "background_estimated"):
            out[key] = {"True": True, "False": False}.get(row[key])
        out["matches"] = json.loads(row["matches"]) if row["matches"] else {}
        return out

    def append(self, rows: list[dict]) -> None:
        """Append rows and flush them to disk before returning."""
        with self._lock:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", newline="", encoding="utf-8") as f:
                if self.kind == ".jsonl":
                    for row in rows:
                        f.write(json.dumps(row) + "\n")
                else:
                    writer = csv.DictWriter(f, fieldnames=COLUMNS)
                    if new:
                        writer.writeheader()
                    for row in rows:
                        writer.writerow({**row, "matches": json.dumps(row["matches"])})
                f.flush()


# ---------------------------------------------------------------- running cases

def _row(cell: BatchCell, request_class: str, **values) -> dict:
    row = {"cell": cell.cell_id, "label": cell.label or "", "diagnosis": "", "votes": 0,
           "total": 0, "correct": None, "bethesda": "", "bethesda_spread": "", "supports": "",
           "case_conclusion": "", "case_outcome": "", "status": "failed", "error": "", "sites_ok": 0,
           "sites_failed": 0, "mask_estimated": None, "background_estimated": None,
           "request_class": request_class, "case_id": "", "case_s": 0.0, "matches": {}}
    row.update(values)
    return row


def _read_files(root: Path, cell: BatchCell) -> tuple[dict[str, bytes], str | None]:
    """The cell's files as {name: bytes}, or a problem (an oversize file is never read).
    A Herlev colour mask is sent as a PNG of 0-3 labels."""
    files = {}
    for name in (cell.files.image, cell.files.background, cell.files.mask):
        if name:
            path = root / name
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                return {}, f"{name}: file is {size} bytes, over the limit of {MAX_FILE_BYTES} bytes"
            files[name] = path.read_bytes()
    if cell.files.mask:
        try:
            files[cell.files.mask] = mask_labels(cell.files.mask, files[cell.files.mask])
        except InvalidInput as exc:
            return {}, str(exc)
    return files, None


def run_case(client: CoordinatorClient, root: Path, cells: list[BatchCell], request_class: str,
             deadline_s: float) -> list[dict]:
    """Check, send and collect one case; one result row per cell (never raises for a site
    or coordinator failure: those become "failed" rows that a later run retries)."""
    rows, sent, by_id = [], [], {}
    for cell in cells:
        files, problem = _read_files(root, cell)
        problem = problem or cell_problem(files, cell.files)
        if problem:
            rows.append(_row(cell, request_class, status="invalid", error=problem))
            continue
        f = cell.files
        sent.append(pb.CellImage(cell_id=f.cell_id, image=files[f.image],
                                 background=files.get(f.background, b""),
                                 mask=files.get(f.mask, b"")))
        by_id[f.cell_id] = cell
    if not sent:
        return rows
    matches: dict[str, dict] = {cid: {} for cid in by_id}
    errors: dict[str, list[str]] = {cid: [] for cid in by_id}
    estimated: dict[str, dict[str, bool]] = {cid: {} for cid in by_id}
    try:
        summary = None
        for event in client.submit(sent, request_class, deadline_s=deadline_s):
            kind = event.WhichOneof("event")
            if kind == "summary":
                summary = event.summary
                continue
            if kind != "site_result":
                continue  # the plan: predictions, not results
            result = event.site_result
            if result.status_code != 0:
                for cid in by_id:
                    errors[cid].append(f"{result.site}: {status_name(result.status_code)} "
                                       f"{result.status_message}")
                continue
            for cell in result.cells:
                if cell.query_cell_id not in by_id:
                    continue
                if cell.error:
                    errors[cell.query_cell_id].append(f"{result.site}: {cell.error}")
                else:
                    flags = estimated[cell.query_cell_id]
                    flags["mask"] = flags.get("mask", False) or cell.mask_estimated
                    flags["background"] = flags.get("background", False) or cell.background_estimated
                    matches[cell.query_cell_id][result.site] = [
                        [m.cell_id, m.diagnosis, round(float(m.distance), 6), m.bethesda, round(float(m.similarity), 4)]
                        for m in cell.matches]
        if summary is None:
            raise RuntimeError("the coordinator's stream ended without a summary")
    except (grpc.RpcError, RuntimeError) as exc:
        detail = client.describe(exc) if isinstance(exc, grpc.RpcError) else str(exc)
        return rows + [_row(c, request_class, error=f"coordinator: {detail}") for c in by_id.values()]
    votes = {v.query_cell_id: v for v in summary.votes}
    concluded = {c.query_cell_id: c for c in summary.conclusion.cells}
    for cid, cell in by_id.items():
        vote = votes.get(cid)
        read = concluded.get(cid)
        answered = bool(matches[cid]) and vote is not None and bool(vote.diagnosis)
        rows.append(_row(
            cell, request_class,
            status="ok" if answered else "failed",
            diagnosis=vote.diagnosis if answered else "",
            votes=vote.votes if answered else 0, total=vote.total if answered else 0,
            correct=(vote.diagnosis == cell.label) if answered and cell.label else None,
            bethesda=read.bethesda if read else "", supports=read.abnormal_term if read else "",
            bethesda_spread=spread_text(read) if read else "",
            case_conclusion=headline(summary.conclusion), case_outcome=summary.conclusion.outcome,
            error="; ".join(errors[cid]), sites_ok=summary.sites_ok,
            sites_failed=summary.sites_failed, case_id=summary.case_id,
            mask_estimated=estimated[cid].get("mask"),
            background_estimated=estimated[cid].get("background"),
            case_s=round(summary.total_s, 6), matches=matches[cid]))
    return rows


class BatchStopped(Exception):
    """The user stopped the batch (Ctrl-C): `done` of `total` cells are in the output (the
    rows written so far; cases in flight are not), and the same command resumes it."""

    def __init__(self, done: int, total: int, out: Path):
        super().__init__(f"stopped after {done} of {total} cells ({out}); run the same command to resume")
        self.done, self.total, self.out = done, total, out


def run_batch(root: str | Path, out: str | Path, coordinator: str,
              request_class: str = "teaching", jobs: int = BATCH_JOBS, case_size: int = BATCH_CASE_CELLS,
              deadline_s: float = CASE_DEADLINE_S, progress: bool = True,
              tls: TLSFiles | None = None) -> BatchSummary:
    """Run every cell under `root` not yet done in `out` through the coordinator.

    root: folder of cells (see `find_cells`). out: .csv or .jsonl, appended to.
    coordinator: "host:port". jobs: cases in flight at once (the concurrency limit).
    case_size: cells per case. tls: connect with TLS (None: plaintext).
    Returns the `BatchSummary` (also of earlier runs' rows). Raises UnknownClass (naming
    the coordinator's classes) when the coordinator has no `request_class`, BatchStopped on
    Ctrl-C (cases not started are dropped, those in flight cancelled).
    """
    from tqdm import tqdm

    if jobs < 1 or case_size < 1:
        raise ValueError("jobs and case_size must be at least 1")
    root = Path(root)
    results = ResultsFile(out)
    cells, problems = find_cells(root)
    done = {cid for cid, row in results.read().items() if row["status"] in DONE_STATUSES}
    todo = [c for c in cells if c.cell_id not in done]
    summary = BatchSummary(out=results.path, cells=len(cells), skipped=len(cells) - len(todo),
                           problems=problems)
    cases = [todo[i:i + case_size] for i in range(0, len(todo), case_size)]
    client = CoordinatorClient(coordinator, tls)
    try:
        client.request_class(request_class)  # UnknownClass names the coordinator's classes
    except grpc.RpcError:
        pass  # the coordinator cannot be asked now: each case reports why, and is tried again
    except BaseException:
        client.close()
        raise
    started = time.perf_counter()
    bar = tqdm(total=len(todo), unit="cell", desc=f"batch ({request_class})",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="batch")
    try:
        futures = [pool.submit(run_case, client, root, case, request_class, deadline_s) for case in cases]
        not_ok = 0
        for future in as_completed(futures):
            rows = future.result()
            results.append(rows)
            summary.run += len(rows)
            not_ok += sum(r["status"] != "ok" for r in rows)
            if not_ok:
                bar.set_postfix(not_ok=not_ok, refresh=False)
            bar.update(len(rows))
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()  # cancels the cases in flight: their threads end at once
        raise BatchStopped(summary.skipped + summary.run, len(cells), results.path) from None
    finally:
        pool.shutdown(wait=True)
        bar.close()
        client.close()
        summary.elapsed_s = time.perf_counter() - started
    summary.rows = {cid: row for cid, row in results.read().items()
                    if cid in {c.cell_id for c in cells}}
    return summary
