"""RandomResizedCrop's box, chosen before decoding, and the DCT scale that box allows.

Choosing the box in original pixels first lets the decoder skip resolution the
crop will throw away: a 1000x800 crop resized to 224 can be decoded at 1/4.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F

from unstall.pipeline.decode import DCT_SCALES

#: A crop as ``(left, top, width, height)`` in pixels.
Box = tuple[int, int, int, int]


def random_resized_crop_box(
    width: int,
    height: int,
    rng: random.Random,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``, drawing from ``rng`` instead of torch.

    Up to 10 tries of an area fraction in ``scale`` and a log-uniform aspect ratio in
    ``ratio``; if none fits, the central crop with the aspect ratio clamped to ``ratio``.
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, w, h
    return center_crop_box(width, height, ratio)


def center_crop_box(width: int, height: int, ratio: tuple[float, float]) -> Box:
    """torchvision's fallback: the largest central crop whose aspect ratio lies in ``ratio``."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def dct_scale(box: Box, size: tuple[int, int]) -> int:
    """The largest DCT downscale (1, 2, 4, 8) that keeps ``box`` at least ``size`` (h, w)."""
    _, _, w, h = box
    out_h, out_w = size
    best = 1
    for s in DCT_SCALES:
        if w >= out_w * s and h >= out_h * s:
            best = s
    return best


def scale_box(box: Box, full: tuple[int, int], decoded: tuple[int, int]) -> Box:
    """Map ``box`` from the ``full`` (width, height) image to the ``decoded`` one, rounded."""
    if full == decoded:
        return box
    fx, fy = decoded[0] / full[0], decoded[1] / full[1]
    left, top, w, h = box
    x0, y0 = round(left * fx), round(top * fy)
    x1 = min(max(round((left + w) * fx), x0 + 1), decoded[0])
    y1 = min(max(round((top + h) * fy), y0 + 1), decoded[1])
    return x0, y0, x1 - x0, y1 - y0


def resize_crop(image: np.ndarray, box: Box, size: tuple[int, int]) -> torch.Tensor:
    """Crop an ``HxWx3`` uint8 array and resize it to ``size`` (h, w): uint8 ``3xhxw``.

    Bilinear with antialiasing, as PIL's (torchvision's) resize: torch's uint8 kernel,
    ~3x faster than PIL's here, within one grey level of it.
    """
    left, top, w, h = box
    view = torch.from_numpy(image).permute(2, 0, 1)[:, top : top + h, left : left + w]
    if (h, w) == size:
        return view.contiguous()
    out = F.interpolate(
        view.unsqueeze(0), size=size, mode="bilinear", antialias=True, align_corners=False
    )
    return out[0]
