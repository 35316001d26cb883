"""``RandomIoUCrop.make_params`` with the same draws and the same decisions, ~10x cheaper.

torchvision's rejection loop draws an overlap option, then up to ``trials`` times a crop
size, a crop place, and checks the boxes with tensor ops on a handful of numbers (format
conversion, centres, ``box_iou``), each trial paying torch's per-op overhead: on 1-10 boxes
the loop costs more than the pixels it saves (milliseconds per sample, hundreds where few
crops pass). Here the draws are the same calls on torch's generator in the same order
(``torch.randint(0, len(options), (1,))``, ``torch.rand(2)``, ``torch.rand(2)``), and the
checks are the same float32 arithmetic in numpy on boxes converted to XYXY once, so the
accepted crop, and the generator's state after, are torchvision's bit for bit (tested
against torchvision's own ``make_params``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as TF

_F32 = np.float32


def iou_crop_params(op: Any, height: int, width: int, boxes: Any) -> dict[str, Any]:
    """``op.make_params`` (``op``: a ``RandomIoUCrop``) for an image ``height x width`` with
    ``boxes`` (a ``BoundingBoxes``): ``{}`` (leave as is) or the crop and the boxes kept."""
    xyxy = TF.convert_bounding_box_format(
        boxes.as_subclass(torch.Tensor), boxes.format, tv_tensors.BoundingBoxFormat.XYXY
    )
    b = xyxy.numpy().astype(_F32, copy=False)
    cx = _F32(0.5) * (b[:, 0] + b[:, 2])
    cy = _F32(0.5) * (b[:, 1] + b[:, 3])
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lo, span = _F32(op.min_scale), _F32(op.max_scale - op.min_scale)
    options = op.options
    while True:
        overlap = options[int(torch.randint(low=0, high=len(options), size=(1,)))]
        if overlap >= 1.0:
            return {}
        for _ in range(op.trials):
            r = torch.rand(2).numpy()
            r = lo + span * r
            new_w, new_h = int(_F32(width) * r[0]), int(_F32(height) * r[1])
            if not (op.min_aspect_ratio <= new_w / new_h <= op.max_aspect_ratio):
                continue
            r = torch.rand(2).numpy()
            left, top = int(_F32(width - new_w) * r[0]), int(_F32(height - new_h) * r[1])
            right, bottom = left + new_w, top + new_h
            if left == right or top == bottom:
                continue
            within = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            if not within.any():
                continue
            if _max_iou(b[within], area[within], left, top, right, bottom) < overlap:
                continue
            return dict(
                top=top,
                left=left,
                height=new_h,
                width=new_w,
                is_within_crop_area=torch.from_numpy(within),
            )


def _max_iou(b: np.ndarray, area: np.ndarray, left: int, top: int, right: int, bottom: int):
    """``box_iou(b, [[left, top, right, bottom]]).max()`` in torchvision's float32 steps."""
    crop = np.array([left, top, right, bottom], dtype=_F32)
    crop_area = (crop[2] - crop[0]) * (crop[3] - crop[1])
    lt = np.maximum(b[:, :2], crop[:2])
    rb = np.minimum(b[:, 2:], crop[2:])
    wh = np.clip(rb - lt, _F32(0), None)
    inter = wh[:, 0] * wh[:, 1]
    union = area + crop_area - inter
    return (inter / union).max()
