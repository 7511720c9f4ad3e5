"""A site's cell database: one SQLite file holding its cells, their images and its settings.

Layout of a site directory::

    SITE_DIR/site.sqlite                  cells, files, problems, config (this module)
    SITE_DIR/index-<fingerprint>.faiss    the search index (pathmaster.site; rebuildable)

A cell's row names its files by path (``cells/ab/abcdef0123456789.png`` the image,
``-thumb.png`` its thumbnail of at most THUMBNAIL_PX a side, ``-mask.png`` the 4-region
label mask, ``-bg.png`` the blank slide); their bytes are in the ``files`` table under that
path (a site indexed before kept them as files under SITE_DIR, which are read still).
Why in SQLite: a million cells are four million small files otherwise, each a directory
entry, an inode and a partly empty block; in SQLite they are pages of one file, written in
the transaction that inserts their rows, and read by primary key as fast as from a file.

Crash safety: a cell's files and its row are inserted in one transaction, so a row never
points at a missing or half-written file. A cell id is derived from the cell's source id,
so an interrupted ingest that is run again skips cells whose rows were committed and
writes the others. Nothing else refers to a cell until its row exists.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

DB_NAME = "site.sqlite"
SCHEMA_VERSION = 3         # 2: group_id and image_hash; 3: cell files in the `files` table (before: beside it; still read)
THUMBNAIL_PX = 64

SCHEMA = """
CREATE TABLE IF NOT EXISTS config (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                 -- JSON
);
CREATE TABLE IF NOT EXISTS cells (
    cell_id              TEXT PRIMARY KEY,
    source_id            TEXT NOT NULL UNIQUE,
    diagnosis            TEXT,
    origin               TEXT NOT NULL,  -- dataset kind, e.g. herlev, synthetic
    image_path           TEXT NOT NULL,  -- relative to the site directory
    thumbnail_path       TEXT NOT NULL,
    mask_path            TEXT,
    background_path      TEXT,
    mask_estimated       INTEGER NOT NULL,
    background_estimated INTEGER NOT NULL,
    features             BLOB NOT NULL,  -- float64 little-endian, one per config feature_names
    added_at             TEXT NOT NULL,
    group_id             TEXT,           -- the slide image the cell was cropped from; NULL unknown
    image_hash           TEXT            -- image_hash() of its pixels; NULL in cells from before v2
);
CREATE TABLE IF NOT EXISTS files (
    path  TEXT PRIMARY KEY,             -- as a cell row names it, e.g. cells/ab/abcdef0123456789.png
    data  BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS problems (
    source   TEXT PRIMARY KEY,          -- the file or cell that could not be ingested
    problem  TEXT NOT NULL,
    seen_at  TEXT NOT NULL
);
"""


# Schema version -> the statements that bring a database of the version before it up to it.
# Old databases are migrated in place when opened: the columns added are NULL for old cells
# (unknown), and `pathmaster index` run again over the dataset fills them in.
MIGRATIONS = {
    2: ("ALTER TABLE cells ADD COLUMN group_id TEXT",
        "ALTER TABLE cells ADD COLUMN image_hash TEXT"),
    3: (),   # the `files` table is made by SCHEMA; files beside the database are still read
}


def image_hash(image: np.ndarray) -> str:
    """32 hex digits of SHA-256 over an image's shape and decoded pixels (uint8).

    The pixels, not the file: a cell stored as PNG and the same cell uploaded as the
    dataset's JPEG or BMP decode to the same array, so they have the same hash.
    """
    pixels = np.ascontiguousarray(image, dtype=np.uint8)
    digest = hashlib.sha256(repr(pixels.shape).encode())
    digest.update(pixels.tobytes())
    return digest.hexdigest()[:32]


def cell_id_for(source_id: str) -> str:
    """The site's id of a cell: 16 hex digits of SHA-1 of its source id (stable across re-runs)."""
    return hashlib.sha1(source_id.encode("utf-8")).hexdigest()[:16]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(slots=True)
class CellRow:
    """One database cell as stored (paths relative to the site directory). Slots: indexing
    and evaluation read one a cell (``SiteDB.cells``), a million at archive scale; a served
    site keeps ``CellColumns`` instead."""

    cell_id: str
    source_id: str
    diagnosis: str | None
    origin: str
    image_path: str
    thumbnail_path: str
    mask_path: str | None
    background_path: str | None
    mask_estimated: bool
    background_estimated: bool
    features: np.ndarray | None = None
    group: str | None = None
    image_hash: str | None = None


_COLUMNS = ("cell_id", "source_id", "diagnosis", "origin", "image_path", "thumbnail_path",
            "mask_path", "background_path", "mask_estimated", "background_estimated", "group_id", "image_hash")


def _row_to_cell(row, features: bytes | None = None) -> CellRow:
    """A CellRow from a row of the ``_COLUMNS`` (positional: a million rows are read at open)."""
    (cell_id, source_id, diagnosis, origin, image_path, thumbnail_path, mask_path, background_path,
     mask_estimated, background_estimated, group, digest) = row
    vector = None if features is None else np.frombuffer(features, dtype="<f8").copy()
    return CellRow(cell_id, source_id, diagnosis, origin, image_path, thumbnail_path, mask_path, background_path,
                   bool(mask_estimated), bool(background_estimated), vector, group, digest)


@dataclass(frozen=True)
class CellColumns:
    """Every cell's id, source id and diagnosis as NumPy arrays, in insertion order (the
    search index's row order), and how many cells each origin has: what a served site keeps
    of its rows in memory, ~35 bytes a cell (short ids) where a ``CellRow`` object a cell took
    ~600. The rest of a row is read from the database when asked for (``read_cell``).

    ids, source_ids: bytes (n,), UTF-8 (``str``: ``cell_id(i)``, ``source_id(i)``).
    diagnosis_codes: unsigned ints (n,) into `diagnoses`, the distinct labels (None:
    unlabelled) in the order first met. origins: {origin: cells}.
    """

    ids: np.ndarray
    source_ids: np.ndarray
    diagnosis_codes: np.ndarray
    diagnoses: tuple[str | None, ...]
    origins: dict[str, int]

    def __len__(self) -> int:
        return len(self.ids)

    def cell_id(self, i: int) -> str:
        return self.ids[i].decode()

    def source_id(self, i: int) -> str:
        return self.source_ids[i].decode()

    def diagnosis(self, i: int) -> str | None:
        return self.diagnoses[self.diagnosis_codes[i]]

    def cell_ids(self, limit: int | None = None) -> list[str]:
        """The first `limit` cells' ids (None: all)."""
        ids = self.ids[:limit]
        return np.char.decode(ids).tolist() if len(ids) else []

    def labels(self) -> list[str | None]:
        return [self.diagnoses[c] for c in self.diagnosis_codes.tolist()]

    def fingerprint(self) -> str:
        """The fingerprint of the database these columns were read from (``SiteDB.fingerprint``)."""
        return ids_fingerprint(self.ids.tolist())


def ids_fingerprint(ids) -> str:
    """The database's fingerprint (``SiteDB.fingerprint``) of its cell ids, UTF-8 bytes in
    insertion order: SHA-1 of them joined."""
    return hashlib.sha1(b"".join(ids)).hexdigest()


def _encoded(texts) -> np.ndarray:
    """Fixed-width UTF-8 bytes of `texts` (NumPy's "S": as wide as the longest)."""
    return np.array([t.encode() for t in texts], dtype="S")


def _paths(row: CellRow) -> tuple:
    return (row.image_path, row.thumbnail_path, row.mask_path, row.background_path)


def read_site_file(conn: sqlite3.Connection, site_dir: Path, relative: str) -> bytes:
    """A cell file's bytes: from the `files` table of `conn`, else from under `site_dir`."""
    row = conn.execute("SELECT data FROM files WHERE path = ?", (relative,)).fetchone()
    if row is not None:
        return bytes(row[0])
    return (Path(site_dir) / relative).read_bytes()


def read_cell(conn: sqlite3.Connection, cell_id: str, *, features: bool = False) -> CellRow:
    """The stored row of `cell_id` through `conn` (with its feature vector when `features`);
    KeyError for an unknown id."""
    query = f"SELECT {', '.join(_COLUMNS)}{', features' if features else ''} FROM cells WHERE cell_id = ?"
    row = conn.execute(query, (cell_id,)).fetchone()
    if row is None:
        raise KeyError(cell_id)
    return _row_to_cell(row[:-1], row[-1]) if features else _row_to_cell(row)


def cells_with_hash(conn: sqlite3.Connection, digest: str) -> list[str]:
    """Ids of the cells whose image hash is ``digest`` (``image_hash``), in insertion order."""
    return [r[0] for r in conn.execute("SELECT cell_id FROM cells WHERE image_hash = ? ORDER BY rowid", (digest,))]


class SiteDB:
    """The SQLite database of one site directory.

    ``SiteDB(site_dir, create=True)`` makes the directory and schema if needed; without
    ``create`` a missing database raises FileNotFoundError naming the path.
    """

    def __init__(self, site_dir: str | Path, *, create: bool = False):
        self.site_dir = Path(site_dir)
        self.path = self.site_dir / DB_NAME
        if not self.path.exists():
            if not create:
                raise FileNotFoundError(f"{self.path}: no site database here (create one with `pathmaster index DATASET --db {self.site_dir}`)")
            self.site_dir.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (``transaction()``), so a batch of
        # cells is committed together or not at all.
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # durable against a killed process
        version = self._version()
        self.conn.executescript(SCHEMA)
        if version is None:
            self.set_config("schema_version", SCHEMA_VERSION)
        elif version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: schema version {version}, this PathMaster reads {SCHEMA_VERSION}")
        elif version < SCHEMA_VERSION:
            self._migrate(version)

    def _version(self) -> int | None:
        """The stored schema version; None for a new, empty database."""
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return self.get_config("schema_version") if "config" in tables else None

    def _migrate(self, version: int) -> None:
        """Bring a database of an older schema version up to SCHEMA_VERSION, in one transaction."""
        with self.transaction():
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[step]:
                    self.conn.execute(statement)
            self.set_config("schema_version", SCHEMA_VERSION)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "SiteDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------ config (JSON values)

    def get_config(self, key: str, default=None):
        row = self.conn.execute("SELECT value FROM config WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_config(self, key: str, value) -> None:
        self.conn.execute("INSERT OR REPLACE INTO config (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # ------------------------------------------------------------ cells

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]

    def source_ids(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT source_id FROM cells")}

    def add_cell(self, cell: CellRow, files: dict[str, bytes] | None = None) -> None:
        """Insert one cell (call inside ``transaction()``) with its `files` (path as the row
        names it -> bytes); without `files` they must exist under the site directory."""
        if files:
            self.conn.executemany("INSERT OR REPLACE INTO files (path, data) VALUES (?, ?)", files.items())
            self.set_config("schema_version", SCHEMA_VERSION)   # older PathMasters cannot read these
        features = np.ascontiguousarray(cell.features, dtype="<f8")
        self.conn.execute(
            f"INSERT INTO cells ({', '.join(_COLUMNS)}, features, added_at) VALUES ({', '.join('?' * (len(_COLUMNS) + 2))})",
            (cell.cell_id, cell.source_id, cell.diagnosis, cell.origin, cell.image_path,
             cell.thumbnail_path, cell.mask_path, cell.background_path, int(cell.mask_estimated),
             int(cell.background_estimated), cell.group, cell.image_hash, features.tobytes(), _now()),
        )
        self.conn.execute("DELETE FROM problems WHERE source = ?", (cell.source_id,))

    def fill_in(self, source_id: str, group: str | None, image_hash: str) -> bool:
        """Set a stored cell's group and image hash where they are unknown (a cell from an
        older schema, met again by ``ingest``); call inside ``transaction()``. Returns
        whether anything changed."""
        cursor = self.conn.execute(
            "UPDATE cells SET group_id = COALESCE(group_id, ?), image_hash = COALESCE(image_hash, ?) "
            "WHERE source_id = ? AND (image_hash IS NULL OR (group_id IS NULL AND ? IS NOT NULL))",
            (group, image_hash, source_id, group))
        return cursor.rowcount > 0

    def cells_with_hash(self, digest: str) -> list[str]:
        """Ids of the cells whose image hash is ``digest`` (``image_hash``), in insertion order."""
        return cells_with_hash(self.conn, digest)

    def cell(self, cell_id: str) -> CellRow:
        """The stored cell (with features); KeyError for an unknown id."""
        return read_cell(self.conn, cell_id, features=True)

    def cells_without_hash(self) -> list[CellRow]:
        """The cells stored before image hashes were kept (``image_hash`` NULL), without
        features, in insertion order (only those rows are read back)."""
        rows = self.conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM cells WHERE image_hash IS NULL ORDER BY rowid")
        return [_row_to_cell(r) for r in rows]

    def cells(self) -> list[CellRow]:
        """Every cell, without features, in insertion order (the index's row order)."""
        rows = self.conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM cells ORDER BY rowid")
        return [_row_to_cell(r) for r in rows]

    def cell_columns(self, batch: int = 65_536) -> CellColumns:
        """Every cell's id, source id, diagnosis and origin as columns (``CellColumns``),
        read `batch` rows at a time: no Python object a cell outlives its batch."""
        ids, sources, codes, origins, diagnoses = [], [], [], Counter(), {}
        cursor = self.conn.execute("SELECT cell_id, source_id, diagnosis, origin FROM cells ORDER BY rowid")
        while rows := cursor.fetchmany(batch):
            cell_ids, source_ids, labels, kinds = zip(*rows)
            ids.append(_encoded(cell_ids))
            sources.append(_encoded(source_ids))
            codes.append(np.fromiter((diagnoses.setdefault(d, len(diagnoses)) for d in labels), np.int64, len(rows)))
            origins.update(kinds)
        code_type = np.min_scalar_type(max(len(diagnoses) - 1, 0))
        if not ids:
            return CellColumns(np.zeros(0, "S1"), np.zeros(0, "S1"), np.zeros(0, code_type), (), {})
        return CellColumns(np.concatenate(ids), np.concatenate(sources), np.concatenate(codes).astype(code_type),
                           tuple(diagnoses), dict(origins))

    def labels(self) -> list[str | None]:
        """Every cell's diagnosis (None: unlabelled) in insertion order, without reading the rest of its row."""
        return [r[0] for r in self.conn.execute("SELECT diagnosis FROM cells ORDER BY rowid")]

    def feature_matrix(self, offset: int = 0) -> tuple[list[str], np.ndarray]:
        """(cell ids, float64 (n_cells, n_features)) in insertion order, from the
        `offset`-th cell on (0: every cell). The vectors' bytes are joined into one buffer
        and viewed as one array (no array a row); ValueError when rows differ in length."""
        ids, buffer, lengths = [], bytearray(), set()
        cursor = self.conn.execute("SELECT cell_id, features FROM cells ORDER BY rowid LIMIT -1 OFFSET ?",
                                   (int(offset),))
        while rows := cursor.fetchmany(65_536):
            ids += [cell_id for cell_id, _ in rows]
            lengths.update(len(blob) for _, blob in rows)
            buffer += b"".join(blob for _, blob in rows)
        if not ids:
            return ids, np.zeros((0, len(self.get_config("feature_names", []))))
        if len(lengths) != 1:
            raise ValueError(f"{self.path}: stored feature vectors differ in length ({sorted(n // 8 for n in lengths)} values)")
        return ids, np.frombuffer(buffer, dtype="<f8").reshape(len(ids), -1)

    def fingerprint(self, limit: int = -1) -> str:
        """SHA-1 over the cell ids in insertion order: changes whenever the cell set does
        (`limit`: of the first `limit` cells only; -1: all). The ids are hashed as one
        string, which is the digest of hashing them one after another."""
        ids = self.conn.execute("SELECT cell_id FROM cells ORDER BY rowid LIMIT ?", (int(limit),)).fetchall()
        return ids_fingerprint(cell_id.encode() for (cell_id,) in ids)

    def remove_cells(self, cell_ids: list[str]) -> list[CellRow]:
        """Delete the rows and stored files of `cell_ids` (call inside ``transaction()``);
        returns the rows removed (files a site kept beside the database are the caller's
        to delete, after the commit). KeyError naming the first unknown id."""
        rows = []
        for cell_id in cell_ids:
            row = self.cell(cell_id)
            rows.append(row)
            self.conn.execute("DELETE FROM cells WHERE cell_id = ?", (cell_id,))
            self.conn.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in _paths(row) if p])
        return rows

    def read_file(self, relative: str) -> bytes:
        """The bytes of a cell file a row names; FileNotFoundError when neither stored nor beside."""
        return read_site_file(self.conn, self.site_dir, relative)

    def set_diagnosis(self, cell_id: str, diagnosis: str | None) -> None:
        """Change one cell's diagnosis; KeyError for an unknown id."""
        if self.conn.execute("UPDATE cells SET diagnosis = ? WHERE cell_id = ?", (diagnosis, cell_id)).rowcount != 1:
            raise KeyError(cell_id)

    # ------------------------------------------------------------ problems

    def record_problem(self, source: str, problem: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO problems (source, problem, seen_at) VALUES (?, ?, ?)",
                          (source, problem, _now()))

    def problems(self) -> list[tuple[str, str]]:
        return list(self.conn.execute("SELECT source, problem FROM problems ORDER BY source"))

    # ------------------------------------------------------------ consistency

    def check(self) -> list[str]:
        """Everything wrong with the database, as sentences; empty when it is consistent.

        Checks SQLite's own integrity, that every path a row names exists and that every
        feature vector has one value per feature name.
        """
        issues = []
        result = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        if result != "ok":
            issues.append(f"sqlite integrity_check: {result}")
        n_features = len(self.get_config("feature_names", []))
        query = "SELECT cell_id, image_path, thumbnail_path, mask_path, background_path, length(features) FROM cells"
        stored = {p for (p,) in self.conn.execute("SELECT path FROM files")}
        for cell_id, *paths, n_bytes in self.conn.execute(query):
            for rel in paths:
                if rel is not None and rel not in stored and not (self.site_dir / rel).is_file():
                    issues.append(f"cell {cell_id}: file {rel} is missing")
            if n_bytes != 8 * n_features:
                issues.append(f"cell {cell_id}: {n_bytes // 8} features stored, expected {n_features}")
        return issues
