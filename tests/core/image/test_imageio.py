"""Image input: every bad file is a clear InvalidInput naming the file; good files decode
exactly as OpenCV (code nobody here wrote) decodes them."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from pathmaster.image.io import (
    MAX_IMAGE_BYTES,
    check_cell,
    decode_image,
    decode_mask,
    encode_png,
    read_image,
    read_mask,
)
from pathmaster.records import InvalidInput


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def rgb() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(37, 53, 3), dtype=np.uint8)


def test_rgb_png_and_bmp_decode_like_opencv(rgb):
    for fmt in ("PNG", "BMP"):
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format=fmt)
        data = buffer.getvalue()
        decoded = decode_image(data, f"cell.{fmt.lower()}")
        reference = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        assert decoded.dtype == np.uint8 and decoded.shape == (37, 53, 3)
        np.testing.assert_array_equal(decoded, reference)


def test_greyscale_is_replicated_to_rgb(rgb):
    grey = rgb[..., 0]
    decoded = decode_image(_png(grey), "grey.png")
    assert decoded.shape == (37, 53, 3)
    for channel in range(3):
        np.testing.assert_array_equal(decoded[..., channel], grey)


def test_sixteen_bit_greyscale_is_scaled_to_eight_bits():
    grey16 = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(grey16).save(buffer, format="PNG")
    decoded = decode_image(buffer.getvalue(), "deep.png")
    np.testing.assert_array_equal(decoded[0, :, 0], [0, 100, 255])


def test_rgba_is_composited_over_white(rgb):
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    rgba[0, 0, 3] = 0  # fully transparent: the lamp shows through
    rgba[0, 1, 3] = 128
    decoded = decode_image(_png(rgba), "alpha.png")
    np.testing.assert_array_equal(decoded[0, 0], [255, 255, 255])
    expected = np.rint(rgb[0, 1].astype(float) * 128 / 255 + 255 * 127 / 255)
    assert np.abs(decoded[0, 1].astype(int) - expected).max() <= 1
    np.testing.assert_array_equal(decoded[1:], rgb[1:])


def test_non_image_bytes_name_the_file():
    with pytest.raises(InvalidInput, match=r"notes\.png: not an image file"):
        decode_image(b"this is a text file, not a PNG", "notes.png")


def test_empty_file():
    with pytest.raises(InvalidInput, match="empty.png: empty file"):
        decode_image(b"", "empty.png")


def test_truncated_png_is_reported(rgb):
    data = _png(rgb)
    with pytest.raises(InvalidInput, match=r"cut\.png: cannot decode image .*truncated"):
        decode_image(data[: len(data) // 2], "cut.png")


def test_over_byte_limit_is_refused_before_decoding(rgb):
    data = _png(rgb)
    with pytest.raises(InvalidInput, match=rf"big\.png: file is {len(data)} bytes, over the limit of 100 bytes"):
        decode_image(data, "big.png", max_bytes=100)
    assert MAX_IMAGE_BYTES == 16 * 1024 * 1024


def test_over_pixel_limit_is_refused_from_the_header():
    # 3000 x 3000 zeros compress to a few KB: small file, huge image (a decompression bomb).
    data = _png(np.zeros((3000, 3000), np.uint8))
    assert len(data) < 100_000
    with pytest.raises(InvalidInput, match=r"bomb\.png: image is 3000 x 3000 = 9000000 pixels, over the limit"):
        decode_image(data, "bomb.png", max_pixels=2000 * 2000)


def test_read_image_checks_size_before_reading(tmp_path, rgb):
    path = tmp_path / "cell.png"
    path.write_bytes(_png(rgb))
    np.testing.assert_array_equal(read_image(path), rgb)
    with pytest.raises(InvalidInput, match="over the limit of 10 bytes") as info:
        read_image(path, max_bytes=10)
    assert info.value.source == str(path)
    with pytest.raises(InvalidInput, match="file not found"):
        read_image(tmp_path / "missing.png")


def test_mask_round_trip_and_palette_indices(tmp_path):
    labels = np.random.default_rng(1).integers(0, 4, size=(20, 30), dtype=np.uint8)
    np.testing.assert_array_equal(decode_mask(encode_png(labels), "m.png", (20, 30, 3)), labels)
    palette = Image.fromarray(labels)
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 756)
    assert palette.mode == "P"  # the labels are now palette indices shown as colours
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG")
    np.testing.assert_array_equal(decode_mask(buffer.getvalue(), "p.png", (20, 30)), labels)
    path = tmp_path / "m.png"
    path.write_bytes(encode_png(labels))
    np.testing.assert_array_equal(read_mask(path, (20, 30)), labels)


def test_mask_of_another_size_is_refused():
    with pytest.raises(InvalidInput, match=r"m\.png: mask is 30 x 20 pixels but its image is 31 x 20"):
        decode_mask(encode_png(np.zeros((20, 30), np.uint8)), "m.png", (20, 31, 3))


def test_mask_labels_outside_0_to_3_are_refused():
    labels = np.zeros((10, 10), np.uint8)
    labels[0, :3] = 255
    labels[1, 0] = 4
    with pytest.raises(InvalidInput, match=r"m\.png: mask has labels outside 0-3 \(4, 255\) in 4 pixels"):
        decode_mask(encode_png(labels), "m.png", (10, 10))


def test_colour_mask_is_refused_with_a_hint():
    colour = np.zeros((10, 10, 3), np.uint8)
    colour[..., 2] = 255
    with pytest.raises(InvalidInput, match="mask is a colour image"):
        decode_mask(encode_png(colour), "herlev-d.png", (10, 10))


def test_check_cell_accepts_a_good_cell_and_names_every_problem(rgb):
    mask = np.zeros(rgb.shape[:2], np.uint8)
    mask[5:20, 5:20] = 1
    mask[10:15, 10:15] = 2
    check_cell(rgb, mask, rgb.copy(), "ok")  # no exception
    check_cell(rgb, None, None, "ok")
    with pytest.raises(InvalidInput, match="c7: mask has no nucleus pixels"):
        check_cell(rgb, np.where(mask == 2, 1, mask).astype(np.uint8), None, "c7")
    with pytest.raises(InvalidInput, match="c7: background is 52 x 37 pixels but the image is 53 x 37"):
        check_cell(rgb, None, rgb[:, :52].copy(), "c7")
    with pytest.raises(InvalidInput, match="c7: mask is 52 x 37"):
        check_cell(rgb, mask[:, :52].copy(), None, "c7")
    with pytest.raises(InvalidInput, match="c7: image must be uint8"):
        check_cell(rgb.astype(np.float32), None, None, "c7")
    with pytest.raises(InvalidInput, match=r"c7: image must be RGB \(H, W, 3\)"):
        check_cell(rgb[..., 0], None, None, "c7")
    bad = mask.copy()
    bad[0, 0] = 9
    with pytest.raises(InvalidInput, match="c7: mask has labels outside 0-3"):
        check_cell(rgb, bad, None, "c7")


def test_encode_png_is_deterministic_and_lossless(rgb):
    assert encode_png(rgb) == encode_png(rgb.copy())
    np.testing.assert_array_equal(decode_image(encode_png(rgb), "x.png"), rgb)


def test_a_wire_thumbnail_is_a_small_webp_as_faithful_as_the_jpeg_of_before():
    """A match's inline thumbnail: WebP, at most WIRE_THUMBNAIL_PX a side, well under half the
    bytes of the 48 px JPEG of before, within 1.5 dB PSNR of it (30 of them and their ids fit
    in one initial congestion window)."""
    from services.site.worker import WIRE_THUMBNAIL_FORMAT, WIRE_THUMBNAIL_PX, WIRE_THUMBNAIL_QUALITY
    from pathmaster.image.io import wire_thumbnail
    from pathmaster.site.ingest import thumbnail
    from pathmaster.image.synth import cell_rng, synth_cell

    def psnr(reference: Image.Image, encoded: bytes) -> float:
        a = np.asarray(reference, dtype=float)
        b = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"), dtype=float)
        return 10 * np.log10(255.0 ** 2 / ((a - b) ** 2).mean())

    px = WIRE_THUMBNAIL_PX
    for index, diagnosis in enumerate(["normal_superficial", "severe_dysplasia", "normal_columnar"]):
        png = encode_png(thumbnail(synth_cell(diagnosis, cell_rng(5, index)).image))
        wire = wire_thumbnail(png, px, WIRE_THUMBNAIL_QUALITY, WIRE_THUMBNAIL_FORMAT)
        jpeg = wire_thumbnail(png, px, 80, "JPEG")
        picture = Image.open(io.BytesIO(wire))
        assert picture.format == "WEBP" and max(picture.size) == px
        assert len(wire) < 0.6 * len(jpeg)
        reference = Image.open(io.BytesIO(png)).convert("RGB")
        reference.thumbnail((px, px), Image.Resampling.LANCZOS)
        assert psnr(reference, wire) > psnr(reference, jpeg) - 1.5
    with pytest.raises(ValueError, match="WEBP or JPEG"):
        wire_thumbnail(png, px, 80, "GIF")
