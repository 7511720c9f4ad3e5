"""Image bytes in, validated NumPy arrays out (and back to PNG bytes).

Everything a user hands PathMaster (an upload, a file in a dataset) passes through here, so
every failure is an `InvalidInput` that names the file and says what is wrong: not an
image, truncated, too large, a mask of the wrong size or with labels outside 0-3, a cell
whose mask has no nucleus.

Arrays follow the records module: images and backgrounds are uint8 (H, W, 3) RGB, masks
are uint8 (H, W) with labels 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus.
"""

from __future__ import annotations

import io
import struct
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from pathmaster.defaults import MAX_IMAGE_BYTES, MAX_PIXELS
from pathmaster.records import MASK_LABELS, NUCLEOLUS, NUCLEUS, InvalidInput

# Pillow's own decompression-bomb guard would only warn below 2x its limit; ours is stricter
# and gives a clear message, so Pillow's is left at its default.

# The formats a microscope's software writes and the README documents, with their file
# suffixes: the one allow-list. Every decoding of an upload or a dataset file opens its
# bytes with only these formats' Pillow openers (`open_accepted`), so a file of any other
# format is refused from its first bytes and no other format's parser or decoder runs
# (Pillow's advice: open only the formats you expect).
ACCEPTED_FORMATS: dict[str, tuple[str, ...]] = {
    "PNG": (".png",), "BMP": (".bmp",), "TIFF": (".tif", ".tiff"), "JPEG": (".jpg", ".jpeg")}
ACCEPTED_SUFFIXES = tuple(suffix for suffixes in ACCEPTED_FORMATS.values() for suffix in suffixes)
ACCEPTED_WORDS = "PNG, BMP, TIFF or JPEG"  # how messages name them

# Reason codes of the InvalidInput this module raises (InvalidInput.code).
NOT_BYTES = "image_not_bytes"
EMPTY = "image_empty"
TOO_MANY_BYTES = "image_too_many_bytes"
FORMAT_NOT_ACCEPTED = "image_format_not_accepted"
TOO_MANY_PIXELS = "image_too_many_pixels"
CORRUPT = "image_corrupt"
NO_PIXELS = "image_no_pixels"
FLOAT_PIXELS = "image_float_pixels"


def open_accepted(data: bytes, name: str, max_bytes: int = MAX_IMAGE_BYTES) -> Image.Image:
    """Open `data` as one of ACCEPTED_FORMATS from its header; nothing is decoded yet.

    Only the accepted formats' Pillow openers look at the bytes (``Image.open(...,
    formats=...)``): any other format, or bytes that are no image, raise InvalidInput
    with code FORMAT_NOT_ACCEPTED and a message naming the accepted formats, before any
    decoder runs. Also refused (each with its code): not bytes, empty, over `max_bytes`,
    and a header that cannot be parsed (CORRUPT).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"expected image bytes, got {type(data).__name__}", name, NOT_BYTES)
    if len(data) == 0:
        raise InvalidInput("empty file (0 bytes)", name, EMPTY)
    if len(data) > max_bytes:
        raise InvalidInput(f"file is {len(data)} bytes, over the limit of {max_bytes} bytes", name,
                           TOO_MANY_BYTES)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=tuple(ACCEPTED_FORMATS))
    except Image.UnidentifiedImageError:
        raise InvalidInput(f"not an image file of an accepted format ({ACCEPTED_WORDS}); "
                           f"save the cell as one of those", name, FORMAT_NOT_ACCEPTED) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidInput(f"image's header says it has over {Image.MAX_IMAGE_PIXELS} pixels "
                           "(Pillow's decompression-bomb limit)", name, TOO_MANY_PIXELS) from None
    except (OSError, SyntaxError, ValueError, struct.error) as exc:
        raise _corrupt(exc, name) from None


def accepted_format(data: bytes, name: str, max_bytes: int = MAX_IMAGE_BYTES) -> str:
    """The format of `data` ("PNG", "BMP", "TIFF", "JPEG"; "MPO" for a multi-picture
    JPEG), read from its header by `open_accepted`, whose InvalidInput it raises."""
    with open_accepted(data, name, max_bytes) as img:
        return img.format or ""


def _corrupt(exc: Exception, name: str) -> InvalidInput:
    return InvalidInput(f"cannot decode image ({exc}); the file is truncated or corrupt", name, CORRUPT)


def _open(data: bytes, name: str, max_bytes: int, max_pixels: int, *, load: bool = True) -> Image.Image:
    """Open `data` (`open_accepted`), enforcing the pixel limit; raise InvalidInput otherwise.

    load: decode the pixels now (so truncation is reported here); when False only the
    header is read, and the file is checked to be complete where its format allows
    that without decoding (`_check_complete`).
    """
    img = open_accepted(data, name, max_bytes)
    width, height = img.size
    if width * height > max_pixels:
        raise InvalidInput(f"image is {width} x {height} = {width * height} pixels, over the limit "
                           f"of {max_pixels} pixels", name, TOO_MANY_PIXELS)
    if width == 0 or height == 0:
        raise InvalidInput(f"image has no pixels ({width} x {height})", name, NO_PIXELS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            if load:
                img.load()  # decodes now, so truncation is reported here
            else:
                _check_complete(img, data)
    except (OSError, SyntaxError, ValueError, struct.error, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise _corrupt(exc, name) from None
    return img


def _check_complete(img: Image.Image, data: bytes) -> None:
    """Raise OSError when an opened (not decoded) image's file is visibly cut short.

    PNG: every chunk fits in the file and the last is IEND. JPEG: an end-of-image marker
    follows the last scan. Other formats' headers do not show it, so those are decoded.
    Damage inside compressed pixel data still shows only on decoding.
    """
    if img.format == "PNG":
        pos = 8  # after the signature: chunks of length (4 bytes), type (4), data, CRC (4)
        while pos + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[pos:pos + 8])
            pos += 12 + length
            if pos > len(data):
                raise OSError(f"its {kind.decode('latin-1')} chunk runs past the end of the file")
            if kind == b"IEND":
                return
        raise OSError("no IEND chunk at the end")
    if img.format == "JPEG":
        scan = data.rfind(b"\xff\xda")
        if scan < 0 or data.rfind(b"\xff\xd9") < scan:
            raise OSError("no end-of-image marker after the scan data")
        return
    img.load()


def _to_rgb(img: Image.Image) -> np.ndarray:
    """Any Pillow mode -> uint8 (H, W, 3) RGB.

    Transparent pixels become white: in bright-field microscopy "nothing there" is the
    lamp shining through a blank slide. 16-bit greyscale is scaled to 8 bits.
    """
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        grey = np.asarray(img).astype(np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or grey.max() > 255 else 255.0
        grey8 = np.clip(np.rint(grey * (255.0 / top)), 0, 255).astype(np.uint8)
        return np.repeat(grey8[:, :, None], 3, axis=2)
    if img.mode == "F":
        raise InvalidInput("floating-point images are not supported; save as 8-bit RGB", None, FLOAT_PIXELS)
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8)
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def decode_image(
    data: bytes,
    name: str,
    *,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_PIXELS,
) -> np.ndarray:
    """Decode an encoded image (one of ACCEPTED_FORMATS: PNG, BMP, TIFF, JPEG) to RGB.

    data: the file's bytes. name: the file name or upload name, used in error messages.
    Returns uint8 (H, W, 3) RGB; greyscale is replicated to 3 channels, alpha is composited
    over white, 16-bit greyscale is scaled to 8 bits.
    Raises InvalidInput (naming `name`, with its code) for non-image bytes or another
    format, a truncated or corrupt file, more than `max_bytes` bytes or more than
    `max_pixels` pixels.
    """
    img = _open(data, name, max_bytes, max_pixels)
    try:
        return _to_rgb(img)
    except InvalidInput as exc:
        raise InvalidInput(exc.problem, name, exc.code) from None


class ImageHeader(NamedTuple):
    """What an image file's header says: size in pixels, Pillow's format and mode names."""

    width: int
    height: int
    format: str
    mode: str

    @property
    def shape(self) -> tuple[int, int]:
        """(H, W), the shape of the decoded image's first two axes."""
        return (self.height, self.width)


def probe_image(
    data: bytes,
    name: str,
    *,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_PIXELS,
) -> ImageHeader:
    """Check an encoded image from its header, without decoding its pixels (for PNG
    and JPEG; other formats are decoded, their headers cannot show a cut-short file).

    Parameters
    ----------
    data : bytes
        The file's bytes.
    name : str
        The file or upload name, used in error messages.
    max_bytes, max_pixels : int
        The limits `decode_image` enforces.

    Returns
    -------
    ImageHeader
        width, height (pixels), format ("PNG", "JPEG", ...) and mode ("RGB", "L", ...).

    Raises InvalidInput, as `decode_image` would, for non-image bytes, a file over either
    limit, no pixels, or a PNG or JPEG visibly cut short. Corrupt compressed pixel data
    is found only by `decode_image`.
    """
    img = _open(data, name, max_bytes, max_pixels, load=False)
    return ImageHeader(img.width, img.height, img.format or "", img.mode)


def read_image(path: str | Path, *, max_bytes: int = MAX_IMAGE_BYTES,
               max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Read an image file as uint8 (H, W, 3) RGB; see `decode_image` for the rules.

    The size limit is checked before reading, so an oversized file is never loaded.
    """
    return decode_image(_read_bytes(path, max_bytes), str(path),
                        max_bytes=max_bytes, max_pixels=max_pixels)


def _read_bytes(path: str | Path, max_bytes: int) -> bytes:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InvalidInput(f"file is {size} bytes, over the limit of {max_bytes} bytes", path,
                               TOO_MANY_BYTES)
        return path.read_bytes()
    except FileNotFoundError:
        raise InvalidInput("file not found", path) from None
    except IsADirectoryError:
        raise InvalidInput("is a directory, not an image file", path) from None
    except PermissionError:
        raise InvalidInput("permission denied", path) from None


def decode_mask(
    data: bytes,
    name: str,
    shape: tuple[int, ...],
    *,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_PIXELS,
) -> np.ndarray:
    """Decode a label-mask image and check it against its cell image.

    data: encoded single-channel image (8-bit greyscale, or palette whose indices are the
    labels; an RGB file is accepted only if it is grey, R == G == B).
    shape: the cell image's shape, (H, W) or (H, W, 3).
    Returns uint8 (H, W) with labels 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus.
    Raises InvalidInput naming `name` when the size differs from the image or a label is
    outside 0-3. Colour-coded masks (e.g. Herlev's) are the importers' job, not this one's.
    """
    img = _open(data, name, max_bytes, max_pixels)
    if img.mode in ("L", "P"):
        labels = np.asarray(img, dtype=np.uint8)  # P: the palette indices are the labels
    elif img.mode in ("I;16", "I;16B", "I;16L", "I"):
        raw = np.asarray(img)
        if raw.max() > 255:
            raise InvalidInput(f"mask labels go up to {int(raw.max())}; expected 0-3", name)
        labels = raw.astype(np.uint8)
    elif img.mode in ("1",):
        labels = np.asarray(img, dtype=np.uint8)
    else:
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
        if not ((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()):
            raise InvalidInput(
                f"mask is a colour image (mode {img.mode}); expected a greyscale label image "
                "with values 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus",
                name,
            )
        labels = rgb[..., 0]
    expected = tuple(shape[:2])
    if labels.shape != expected:
        raise InvalidInput(
            f"mask is {labels.shape[1]} x {labels.shape[0]} pixels but its image is "
            f"{expected[1]} x {expected[0]} (width x height)",
            name,
        )
    _check_labels(labels, name)
    return labels


def read_mask(path: str | Path, shape: tuple[int, ...], *,
              max_bytes: int = MAX_IMAGE_BYTES) -> np.ndarray:
    """Read a label-mask file; see `decode_mask`."""
    return decode_mask(_read_bytes(path, max_bytes), str(path), shape, max_bytes=max_bytes)


def _check_labels(mask: np.ndarray, name: str | None) -> None:
    """Raise InvalidInput unless every value of the integer array `mask` is in MASK_LABELS."""
    low, high = min(MASK_LABELS), max(MASK_LABELS)
    if mask.size and len(MASK_LABELS) == high - low + 1 and low <= mask.min() and mask.max() <= high:
        return  # the common case, in two passes without sorting; the message needs more
    bad = np.setdiff1d(np.unique(mask), MASK_LABELS)
    if bad.size:
        count = int(np.isin(mask, bad).sum())
        shown = ", ".join(str(int(v)) for v in bad[:8]) + (" ..." if bad.size > 8 else "")
        raise InvalidInput(
            f"mask has labels outside 0-3 ({shown}) in {count} pixels; expected "
            "0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus",
            name,
        )


def check_mask(mask: np.ndarray, shape: tuple[int, ...], name: str | None) -> None:
    """Check a label mask against its image's shape; raise InvalidInput naming `name` if not.

    Parameters
    ----------
    mask : ndarray of int, shape (H, W)
        Labels 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus; any integer dtype
        (PathMaster makes uint8).
    shape : tuple of int
        The image's shape, (H, W) or (H, W, 3).
    name : str or None
        The file or cell named in the error message.

    A mask need not have a nucleus here (a hint for the background estimate need not);
    a cell's mask must, see `check_cell`.
    """
    if not isinstance(mask, np.ndarray) or mask.ndim != 2:
        got = getattr(mask, "shape", type(mask).__name__)
        raise InvalidInput(f"mask must be a 2-D label array, got {got}", name)
    if not np.issubdtype(mask.dtype, np.integer):
        raise InvalidInput(f"mask must be an integer label array (uint8), got {mask.dtype}", name)
    height, width = shape[:2]
    if mask.shape != (height, width):
        raise InvalidInput(
            f"mask is {mask.shape[1]} x {mask.shape[0]} pixels but the image is "
            f"{width} x {height} (width x height; mask shape {mask.shape}, image shape "
            f"{(height, width)})",
            name,
        )
    _check_labels(mask, name)


def check_cell(
    image: np.ndarray,
    mask: np.ndarray | None,
    background: np.ndarray | None,
    name: str | None,
) -> None:
    """Check that a cell's arrays fit together; raise InvalidInput naming `name` if not.

    The one rule for a cell's arrays: the decoders, the segmentation, the features and
    the site analysis all check with it.

    Parameters
    ----------
    image : ndarray of uint8, shape (H, W, 3)
        RGB cell image, at least one pixel.
    mask : ndarray of int, shape (H, W), or None
        Labels 0-3 (`check_mask`) with at least one nucleus pixel: label 2, or 3 (a
        nucleolus lies inside its nucleus, so it counts as nucleus).
    background : ndarray of uint8, shape (H, W, 3), or None
        The blank slide, the image's shape.
    name : str or None
        The file or cell named in the error message.
    """
    _check_rgb(image, "image", name)
    height, width = image.shape[:2]
    if background is not None:
        _check_rgb(background, "background", name)
        if background.shape != image.shape:
            raise InvalidInput(
                f"background is {background.shape[1]} x {background.shape[0]} pixels but the "
                f"image is {width} x {height} (width x height; background shape "
                f"{background.shape}, image shape {image.shape})",
                name,
            )
    if mask is None:
        return
    check_mask(mask, image.shape, name)
    if not ((mask == NUCLEUS).any() or (mask == NUCLEOLUS).any()):
        raise InvalidInput(
            "mask has no nucleus pixels (label 2, or 3); every cell needs a nucleus", name)


def _check_rgb(array: np.ndarray, what: str, name: str | None) -> None:
    if not isinstance(array, np.ndarray):
        raise InvalidInput(f"{what} must be a NumPy array, got {type(array).__name__}", name)
    if array.ndim != 3 or array.shape[2] != 3:
        raise InvalidInput(f"{what} must be RGB (H, W, 3), got shape {array.shape}", name)
    if array.dtype != np.uint8:
        raise InvalidInput(f"{what} must be uint8, got {array.dtype}", name)
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InvalidInput(f"{what} has no pixels", name)


def encode_png(array: np.ndarray, *, compress_level: int = 6) -> bytes:
    """Encode uint8 (H, W) or (H, W, 3) as PNG bytes (deterministic: no timestamps)."""
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise ValueError(f"encode_png needs uint8 (H, W) or (H, W, 3), got {array.dtype} {array.shape}")
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def write_png(path: str | Path, array: np.ndarray) -> Path:
    """Write uint8 (H, W) or (H, W, 3) to `path` as PNG; returns the path."""
    path = Path(path)
    path.write_bytes(encode_png(array))
    return path


def wire_thumbnail(image_file: bytes, size: int, quality: int = 80, fmt: str = "WEBP") -> bytes:
    """A small lossy thumbnail of an encoded image, for the first answer a user sees.

    Parameters
    ----------
    image_file : bytes
        An encoded image (PNG, as the site database stores thumbnails).
    size : int
        The longer side of the result, in pixels.
    quality : int
        Encoder quality (1-95 JPEG, 1-100 WebP).
    fmt : str
        "WEBP" (what sites send with their matches) or "JPEG".

    Returns
    -------
    bytes
        WebP or baseline JPEG bytes. At 48 px and quality 80 a cell is ~300 B as WebP
        against ~640 B as JPEG, at about the same fidelity (benchmarks/bench_wire_reply.py),
        so that a site's 30 matches fit in one initial congestion window.
    """
    picture = open_accepted(image_file, "thumbnail").convert("RGB")
    picture.thumbnail((size, size), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    if fmt.upper() == "WEBP":
        picture.save(buffer, format="WEBP", quality=quality, method=6)
    elif fmt.upper() == "JPEG":
        picture.save(buffer, format="JPEG", quality=quality, optimize=True)
    else:
        raise ValueError(f"wire thumbnails are WEBP or JPEG, not {fmt!r}")
    return buffer.getvalue()
