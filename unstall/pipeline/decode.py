"""Image decode: simplejpeg (libjpeg-turbo, optional DCT downscaling) first, PIL as fallback.

Measured on this project's synthetic JPEGs (`unstall make-dataset`: 500x375, ~76 KB,
quality 90), one core pinned with ``taskset``, torch 2.13 CPU, Pillow 13.0 (libjpeg-turbo),
simplejpeg 1.9; medians of 5 interleaved rounds of 120 images on a shared 2-core machine:

=================================================  ========
decode to an HxWx3 uint8 RGB array                 images/s
=================================================  ========
PIL ``open().convert("RGB")`` + ``np.asarray``          668
PIL decode alone (``open().load()``, no array)        ~1170
PIL draft mode 1/2 (``Image.draft``) + array           1189
PIL draft mode 1/4 + array                             1371
OpenCV 5 ``imdecode`` (measured, not a dependency)     1191
OpenCV 5 ``IMREAD_REDUCED_COLOR_2``                    1480
simplejpeg, full size                                  1261
simplejpeg, ``fastdct=True``                           1297
simplejpeg, 1/2 scale (``min_height/min_width``)       1469
simplejpeg, 1/4 scale                                  1569
simplejpeg, 1/8 scale                                  1693
=================================================  ========

simplejpeg is the default: the fastest decoder here, it hands back a numpy array
(no PIL image to copy out of), and its output is bit-identical to PIL's at every
scale (same libjpeg-turbo, accurate integer IDCT; tested). ``fastdct`` is left off:
+3 % for ~1 grey level of error per pixel. Non-power-of-two scales (7/8, 3/4, 5/8)
decode slower than full size (no SIMD path), so only 1/2, 1/4, 1/8 are used.
Entropy decoding dominates at this size, so DCT scaling gains 15-35 % at most; and a
224 crop of a 375-pixel-high image never allows 1/2, so on this data it never applies.
PyTurboJPEG was not measured: no system libturbojpeg here.
"""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from unstall.errors import UnstallError

#: DCT scale denominators libjpeg-turbo decodes fast (SIMD): 1/1, 1/2, 1/4, 1/8.
DCT_SCALES = (1, 2, 4, 8)

_JPEG_MAGIC = b"\xff\xd8\xff"
# JPEG colour spaces that simplejpeg converts differently from PIL (Adobe inverted CMYK).
_PIL_ONLY_COLORSPACES = ("CMYK", "YCCK")


class DecodeError(UnstallError, ValueError):
    """Bytes that are not a readable image: corrupt, truncated, or another file type."""


def image_size(data: bytes) -> tuple[int, int]:
    """The ``(width, height)`` of an encoded image, read from its header only."""
    if data[:3] == _JPEG_MAGIC:
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            pass
        else:
            if width > 0 and height > 0:
                return width, height
    return _open_pil(data).size


def decode_jpeg(data: bytes, *, scale: int = 1) -> np.ndarray:
    """Decode an image to an RGB ``HxWx3`` uint8 array, downscaled ``1/scale`` in the DCT.

    JPEGs go through simplejpeg; CMYK JPEGs, other formats (PNG, WebP...) and JPEGs
    simplejpeg rejects go through PIL (``convert("RGB")``, as torchvision's loader).
    Formats that cannot scale while decoding come back at full size, so callers
    must read the scale they got from the array's shape.

    Args:
        data: the encoded file.
        scale: 1, 2, 4 or 8; the result is ``ceil(height / scale) x ceil(width / scale)``.

    Raises:
        DecodeError: the bytes are not a decodable image.
    """
    if scale not in DCT_SCALES:
        raise ValueError(f"scale={scale!r} must be one of {DCT_SCALES} (DCT scaling factors)")
    if data[:3] == _JPEG_MAGIC:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            if colorspace not in _PIL_ONLY_COLORSPACES:
                return simplejpeg.decode_jpeg(
                    data,
                    colorspace="RGB",
                    min_height=-(-height // scale),
                    min_width=-(-width // scale),
                )
        except ValueError:
            pass  # let PIL try: it tolerates what libjpeg only warns about, like torchvision
    return decode_pil(data, scale=scale)


def decode_pil(data: bytes, *, scale: int = 1) -> np.ndarray:
    """Decode any image PIL reads to an RGB ``HxWx3`` uint8 array (JPEG: draft-mode scaling)."""
    image = _open_pil(data)
    try:
        if scale > 1 and image.format == "JPEG":
            width, height = image.size
            image.draft("RGB", (width // scale, height // scale))  # PIL rounds up
        return np.array(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(_describe(data, f"{type(exc).__name__}: {exc}")) from exc


def _open_pil(data: bytes) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(_describe(data, f"{type(exc).__name__}: {exc}")) from exc


def _describe(data: bytes, reason: str) -> str:
    return (
        f"cannot decode image ({len(data)} bytes, starting {bytes(data[:8])!r}): {reason}; "
        "the file is corrupt, truncated or not an image: re-create it or remove it from the dataset"
    )
