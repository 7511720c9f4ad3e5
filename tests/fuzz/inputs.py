"""What the fuzz suite sends: Hypothesis strategies for images, ids, classes, k, deadlines,
whole requests and mutated protobuf bytes.

Each generated image says what the services should make of it (`Picture`): whether its
header is fine (a site checks only that before queueing it), whether its whole file is
(the coordinator's probe: a PNG or JPEG cut short shows it, a BMP is decoded), and whether
it decodes to a cell image at all (the gateway decodes what it stages). Each request says
whether it is well formed (`Sent.defects`): the fuzz targets turn that into the status
code expected.
"""

from __future__ import annotations

import io
import math
import zlib
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st
from PIL import Image

from pathmaster import defaults
from qos.classes import DEFAULT_CLASSES
from qos.policy import MAX_CASE_DEADLINE_S
from services.shared import MAX_K
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

KNOWN_CLASSES = tuple(DEFAULT_CLASSES.names())
# Formats Pillow reads and writes that the allow-list refuses, with the mode each is written in.
OTHER_FORMATS = {"GIF": "P", "PPM": "RGB", "TGA": "RGB", "SGI": "RGB", "PCX": "RGB", "ICO": "RGBA",
                 "WEBP": "RGB", "QOI": "RGB", "DDS": "RGB"}
# (format, mode) pairs an accepted format writes; "F" (32-bit float) decodes but is no cell image.
ODD_MODES = [("PNG", "RGB"), ("PNG", "L"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "LA"), ("PNG", "1"),
             ("PNG", "I;16"), ("BMP", "RGB"), ("BMP", "L"), ("BMP", "1"), ("JPEG", "RGB"), ("JPEG", "L"),
             ("JPEG", "CMYK"), ("TIFF", "RGB"), ("TIFF", "CMYK"), ("TIFF", "I;16"), ("TIFF", "F")]


@dataclass(frozen=True)
class Picture:
    """An encoded image and what it is: `label` for the counts; `header_ok`: its header is
    readable, of an accepted format and within a cell's pixels; `file_ok`: the coordinator's
    probe of the whole file passes; `decodes`: it decodes to an RGB cell image."""

    data: bytes
    label: str
    header_ok: bool
    file_ok: bool
    decodes: bool

    def __repr__(self) -> str:  # Hypothesis prints failing inputs: not the bytes
        return f"Picture({self.label}, {len(self.data)} bytes)"


def encode(array: np.ndarray, fmt: str, mode: str) -> bytes:
    """uint8 (H, W, 3) `array` converted to `mode` and saved as `fmt`."""
    picture = Image.fromarray(array)
    picture = picture.convert("I").convert("I;16") if mode == "I;16" and fmt == "PNG" else (
        picture.convert("L").convert(mode) if mode in ("F", "I;16") else picture.convert(mode))
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


@st.composite
def pixels(draw, max_side: int = 96) -> np.ndarray:
    """uint8 (H, W, 3) of an odd size, 1 px to `max_side` a side: noise or one colour."""
    height, width = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    seed = draw(st.integers(0, 2**16))
    if draw(st.booleans()):
        return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return np.full((height, width, 3), seed % 256, np.uint8)


@st.composite
def valid_pictures(draw) -> Picture:
    fmt, mode = draw(st.sampled_from(ODD_MODES))
    data = encode(draw(pixels()), fmt, mode)
    return Picture(data, f"{fmt} {mode}", True, True, mode != "F")


@st.composite
def other_formats(draw) -> Picture:
    fmt = draw(st.sampled_from(sorted(OTHER_FORMATS)))
    data = encode(draw(pixels(48)), fmt, OTHER_FORMATS[fmt])
    return Picture(data, f"other format {fmt}", False, False, False)


@st.composite
def wrong_headers(draw) -> Picture:
    """An accepted file whose first bytes are replaced (another format's magic, or junk)."""
    data = encode(draw(pixels(48)), draw(st.sampled_from(["PNG", "BMP", "JPEG", "TIFF"])), "RGB")
    magic = draw(st.sampled_from([b"GIF89a", b"P6\n", b"RIFF", b"qoif", b"DDS ", b"\x00\x00\x01\x00",
                                  b"\x00\x00\x00\x00"]))
    return Picture(magic + data[len(magic):], "wrong header", False, False, False)


@st.composite
def junk(draw) -> Picture:
    """Bytes that are no image (they start with a byte no accepted format starts with)."""
    data = b"\x00" + draw(st.binary(max_size=2048))
    return Picture(data, "junk bytes", False, False, False)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


@st.composite
def bombs(draw) -> Picture:
    """A tiny PNG whose header claims more pixels than a cell may have (a field of view, or
    a decompression bomb of up to 2**31 a side), its data one small deflate stream."""
    side = draw(st.integers(1025, 2**31 - 1))
    other = draw(st.integers(1025, 2**20))
    ihdr = side.to_bytes(4, "big") + other.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    idat = zlib.compress(b"\x00" * draw(st.integers(1, 4096)), 9)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
    return Picture(data, "bomb header", False, False, False)


@st.composite
def fields_of_view(draw) -> Picture:
    """A real image over a cell's pixels (MAX_ANALYSIS_PIXELS): one colour, so it is quick."""
    side = math.isqrt(defaults.MAX_ANALYSIS_PIXELS) + draw(st.integers(1, 200))
    data = encode(np.full((side, side // 2 + draw(st.integers(side // 2, side)), 3), 200, np.uint8), "PNG", "RGB")
    return Picture(data, "field of view", False, False, False)


def _pixel_start(data: bytes, fmt: str) -> int:
    """Where the pixel data begins: past the header a site reads."""
    if fmt == "PNG":
        return data.index(b"IDAT") + 8
    if fmt == "JPEG":  # past the start-of-scan segment: its marker, then its length
        scan = data.rindex(b"\xff\xda")
        return scan + 2 + int.from_bytes(data[scan + 2:scan + 4], "big")
    return int.from_bytes(data[10:14], "little")  # BMP: the pixel array's offset


@st.composite
def truncated(draw) -> Picture:
    """A PNG, JPEG or BMP cut short inside its pixel data (its header intact)."""
    fmt = draw(st.sampled_from(["PNG", "JPEG", "BMP"]))
    data = encode(draw(pixels()), fmt, "RGB")
    cut = draw(st.integers(_pixel_start(data, fmt) + 1, len(data) - 1))
    return Picture(data[:cut], f"truncated {fmt}", True, False, False)


@st.composite
def corrupt_pixels(draw) -> Picture:
    """A PNG whose compressed pixels are replaced by junk of the same length (CRC valid):
    only decoding shows it."""
    data = encode(draw(pixels()), "PNG", "RGB")
    start = data.index(b"IDAT") - 4
    length = int.from_bytes(data[start:start + 4], "big")
    garbage = b"\x00" + draw(st.binary(min_size=length - 1, max_size=length - 1))  # never a zlib header
    return Picture(data[:start] + png_chunk(b"IDAT", garbage) + data[start + 12 + length:],
                   "corrupt pixels", True, True, False)


def pictures() -> st.SearchStrategy[Picture]:
    """Any image the suite sends, valid ones about half the time."""
    return mostly(valid_pictures(), st.one_of(other_formats(), wrong_headers(), junk(), bombs(), fields_of_view(),
                                              truncated(), corrupt_pixels()))


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy, times: int = 1) -> st.SearchStrategy:
    """`good` `times` as often as `bad` (Hypothesis's one_of picks its branches alike)."""
    return st.one_of(*[good] * times, bad)


# ------------------------------------------------------------------ ids, classes, k, deadlines

VALID_ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,30}", fullmatch=True)


def ids(limit: int) -> st.SearchStrategy[tuple[str, bool]]:
    """(an id, whether check_id accepts it): valid ones, too long, odd characters."""
    return mostly(
        VALID_ID.map(lambda v: (v, True)), st.one_of(
        st.integers(limit + 1, limit + 5000).map(lambda n: ("a" * n, False)),
        st.text(min_size=1, max_size=40).filter(lambda v: not all(c.isascii() and (c.isalnum() or c in "._:-")
                                                                  for c in v)).map(lambda v: (v, False))), 3)


def classes() -> st.SearchStrategy[tuple[str, str]]:
    """(a request class, "known", "empty" or "unknown")."""
    return mostly(st.one_of(st.sampled_from(KNOWN_CLASSES).map(lambda c: (c, "known")), st.just(("", "empty"))),
                  st.one_of(st.sampled_from(["no-such-class", "URGENT", "urgent ", "x" * 5000]),
                            VALID_ID.filter(lambda c: c not in KNOWN_CLASSES)).map(lambda c: (c, "unknown")), 3)


def ks() -> st.SearchStrategy[tuple[int, bool]]:
    """(k, whether it is 0-MAX_K), int32 on the wire."""
    return mostly(st.integers(0, 12).map(lambda k: (k, True)),
                  st.integers(-2**31, 2**31 - 1).map(lambda k: (k, 0 <= k <= MAX_K)), 3)


def case_deadlines() -> st.SearchStrategy[tuple[float, bool]]:
    """(a case's deadline_s, whether the coordinator accepts it)."""
    def ok(d: float) -> bool:
        return math.isfinite(d) and 0 <= d <= MAX_CASE_DEADLINE_S
    return mostly(st.one_of(st.just(0.0), st.floats(0.5, 30.0)),
                  st.floats(allow_nan=True, allow_infinity=True), 3).map(lambda d: (d, ok(d)))


def call_timeouts() -> st.SearchStrategy[float]:
    """The gRPC deadline of a call, seconds: mostly enough, sometimes far too short."""
    return st.one_of(st.floats(5.0, 20.0), st.floats(0.001, 1.0))


# ------------------------------------------------------------------ requests


@dataclass
class Sent:
    """A request and what is wrong with it (empty `defects`: well formed); `pictures` its
    images, for the counts."""

    message: object
    defects: list[str] = field(default_factory=list)
    pictures: list[Picture] = field(default_factory=list)
    request_class: str = ""

    def __repr__(self) -> str:
        return f"Sent({type(self.message).__name__}, defects={self.defects}, pictures={self.pictures})"


@st.composite
def cell_images(draw, check_ids: bool) -> tuple[list[pb.CellImage], list[str], list[Picture]]:
    """0-3 cells: (CellImages, defects a coordinator sees, their pictures)."""
    cells, defects, shown = [], [], []
    for i in range(draw(mostly(st.integers(1, 3), st.just(0), 4))):
        cell_id, id_ok = draw(mostly(ids(defaults.MAX_CELL_ID_CHARS), st.just(("", False)), 5))
        picture = draw(pictures())
        cell = pb.CellImage(cell_id=cell_id, image=picture.data)
        if draw(st.integers(0, 9)) == 0:
            cell.background = picture.data  # the image's size: a blank slide of another look
        cells.append(cell)
        shown.append(picture)
        if check_ids and not id_ok:
            defects.append("cell id")
        defects += [] if picture.file_ok else [picture.label]
    if check_ids and len({c.cell_id for c in cells}) < len(cells):
        defects.append("cell id twice")
    if not cells:
        defects.append("no cells")
    return cells, defects, shown


@st.composite
def case_requests(draw, known_site: str) -> Sent:
    """A CaseRequest for the coordinator's SubmitCase (`known_site`: one of its sites)."""
    cells, defects, shown = draw(cell_images(check_ids=True))
    request_class, kind = draw(classes())
    case_id, id_ok = draw(st.one_of(st.just(("", True)), ids(defaults.MAX_CASE_ID_CHARS)))
    k, k_ok = draw(ks())
    deadline, deadline_ok = draw(case_deadlines())
    ship = draw(st.sampled_from(["", "", "", "auto", "images", "features", "everything"]))
    sites = draw(st.sampled_from([[], [], [], [], [known_site], ["nowhere"]]))
    request = pb.CaseRequest(case_id=case_id, request_class=request_class, cells=cells, k=k,
                             deadline_s=deadline, ship=ship, sites=sites)
    defects += [name for name, ok in (("case id", id_ok), ("class", kind != "unknown"), ("k", k_ok),
                                      ("deadline", deadline_ok), ("ship", ship != "everything"),
                                      ("site", sites != ["nowhere"])) if not ok]
    return Sent(request, defects, shown, request_class)


@st.composite
def analyse_requests(draw) -> Sent:
    """An AnalyseRequest for a site (images mode): the site checks headers, class and k."""
    cells, _, shown = draw(cell_images(check_ids=False))
    request_class, kind = draw(classes())
    k, k_ok = draw(ks())
    defects = [p.label for p in shown if not p.header_ok] + ([] if cells else ["no cells"])
    defects += [name for name, ok in (("class", kind != "unknown"), ("k", k_ok)) if not ok]
    request = pb.AnalyseRequest(case_id=draw(VALID_ID), request_class=request_class, k=k, cells=cells)
    return Sent(request, defects, shown, request_class)


@st.composite
def mutated(draw, message) -> bytes:
    """`message` serialized, then damaged: bytes flipped, cut, inserted or replaced."""
    data = bytearray(message.SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "insert", "replace"]))
        at = draw(st.integers(0, len(data)))
        if how == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            data = bytearray(draw(st.binary(max_size=256)))
    return bytes(data)


# ------------------------------------------------------------------ the gateway's requests

FILE_NAMES = st.one_of(
    st.sampled_from(["cell.png", "cell.PNG", "cell.bmp", "cell.tif", "cell.tiff", "cell.jpg", "cell.jpeg",
                     "cell-background.png"]),
    st.sampled_from(["cell.gif", "cell.webp", "cell", "cell.png.exe", "../cell.png", "a\\cell.png"]),
    st.text(min_size=1, max_size=40).map(lambda s: s + ".png"))

JSON = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def pair_bodies():
    """Bodies for POST /api/pair: file names to pair, or any JSON."""
    return st.one_of(st.fixed_dictionaries({"names": st.lists(FILE_NAMES, max_size=12)}), JSON)


def staged_case_bodies():
    """Bodies for POST /api/case as JSON: references to files never staged, any class and
    case id, or any JSON."""
    refs = st.lists(st.fixed_dictionaries({"name": FILE_NAMES, "id": st.one_of(
        st.from_regex(r"[0-9a-f]{64}", fullmatch=True), st.text(max_size=70))}), max_size=4)
    return st.one_of(st.fixed_dictionaries({"files": refs, "request_class": classes().map(lambda c: c[0][:80]),
                                            "case_id": st.text(max_size=80)}), JSON)


PORTS = st.sampled_from(["control", *KNOWN_CLASSES])
