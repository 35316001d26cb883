"""decode_jpeg: simplejpeg path bit-identical to PIL, DCT scales, fallbacks, corrupt data."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from unstall.data.synthetic import render_image
from unstall.pipeline import DecodeError, decode_jpeg, image_size


def _encode(array: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, fmt)
    return out.getvalue()


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return render_image(0, 0, classes=1)  # 500x375


def test_full_decode_is_bit_identical_to_pil(jpeg: bytes) -> None:
    expected = np.array(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    got = decode_jpeg(jpeg)
    assert got.dtype == np.uint8 and got.shape == (375, 500, 3)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize(
    ("scale", "shape"), [(2, (188, 250, 3)), (4, (94, 125, 3)), (8, (47, 63, 3))]
)
def test_dct_scale_matches_pil_draft(jpeg: bytes, scale: int, shape: tuple[int, int, int]) -> None:
    image = Image.open(io.BytesIO(jpeg))
    image.draft("RGB", (500 // scale, 375 // scale))
    got = decode_jpeg(jpeg, scale=scale)
    assert got.shape == shape
    assert np.array_equal(got, np.array(image.convert("RGB")))


def test_bad_scale_names_value(jpeg: bytes) -> None:
    with pytest.raises(ValueError, match="scale=3"):
        decode_jpeg(jpeg, scale=3)


def test_grayscale_jpeg_becomes_rgb() -> None:
    gray = np.random.default_rng(0).integers(0, 256, (40, 60), dtype=np.uint8)
    data = _encode(gray, "JPEG")
    got = decode_jpeg(data)
    assert got.shape == (40, 60, 3)
    assert np.array_equal(got, np.array(Image.open(io.BytesIO(data)).convert("RGB")))
    assert np.array_equal(got[..., 0], got[..., 2])


def test_cmyk_jpeg_goes_through_pil() -> None:
    cmyk = np.random.default_rng(1).integers(0, 256, (30, 50, 4), dtype=np.uint8)
    data = _encode(cmyk, "JPEG", "CMYK")
    assert np.array_equal(decode_jpeg(data), np.array(Image.open(io.BytesIO(data)).convert("RGB")))


def test_png_is_decoded_exactly() -> None:
    rgb = np.random.default_rng(2).integers(0, 256, (33, 47, 3), dtype=np.uint8)
    data = _encode(rgb, "PNG")
    assert np.array_equal(decode_jpeg(data), rgb)
    assert np.array_equal(decode_jpeg(data, scale=4), rgb)  # PNG cannot scale: full size
    assert image_size(data) == (47, 33)


def test_image_size_reads_header(jpeg: bytes) -> None:
    assert image_size(jpeg) == (500, 375)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\xff\xd8\xff\xe0garbage-after-jpeg-magic"],
    ids=["empty", "text", "jpeg-magic"],
)
def test_garbage_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError, match=f"cannot decode image \\({len(data)} bytes"):
        decode_jpeg(data)


def test_truncated_jpeg_raises_value_error(jpeg: bytes) -> None:
    with pytest.raises(ValueError, match="OSError: image file is truncated"):
        decode_jpeg(jpeg[: len(jpeg) // 2])
