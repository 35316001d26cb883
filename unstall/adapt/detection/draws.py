"""``RandomIoUCrop.make_params`` with the same draws and the same decisions, far cheaper.

torchvision's rejection loop draws an overlap option, then up to ``trials`` times a crop
size, a crop place, and checks the boxes with tensor ops on a handful of numbers (format
conversion, centres, ``box_iou``), each trial paying torch's per-op overhead: on 1-10 boxes
the loop costs more than the pixels it saves (milliseconds per sample, hundreds where few
crops pass). Here the draws are the same numbers from torch's generator in the same order
(``torch.randint(0, len(options), (1,))``, then the trials' ``torch.rand(2)`` pairs, taken
as one block and the generator moved on by exactly what the trials took), and the checks
are the same float32 arithmetic in numpy on boxes converted to XYXY once, for all of an
option's trials at once, so the accepted crop, and the generator's state after, are
torchvision's bit for bit (tested against torchvision's own ``make_params``). On the SSD
preset's zoomed-out canvases (about 130 draws a sample): 8.1 -> 1.2 ms a sample, the loop
a trial at a time against the block.
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
    options = op.options
    while True:
        overlap = options[int(torch.randint(low=0, high=len(options), size=(1,)))]
        if overlap >= 1.0:
            return {}
        found = _trials(op, height, width, b, overlap)
        if found is not None:
            return found


def _trials(op: Any, height: int, width: int, b: np.ndarray, overlap: float) -> dict | None:
    """One overlap option's ``op.trials`` trials: the crop the first passing one draws, or
    None; torch's generator left as torchvision's trials leave it.

    The trials' draws are taken as one block (``torch.rand(4 * trials)``: the most they can
    take, the same numbers as their ``torch.rand(2)`` calls in turn), every trial's sizes,
    places and box checks are computed on it at once, and the generator is then wound back
    and moved on by exactly the draws the trials took up to the one that passed."""
    trials = op.trials
    state = torch.get_rng_state()
    u = torch.rand(4 * trials).numpy()
    r = _F32(op.min_scale) + _F32(op.max_scale - op.min_scale) * u  # a size draw, anywhere
    widths = (_F32(width) * r).astype(np.int64).tolist()
    heights = (_F32(height) * r).astype(np.int64).tolist()
    lo, hi = op.min_aspect_ratio, op.max_aspect_ratio
    at: list[int] = []  # where each trial that draws a place starts in the block
    sizes: list[tuple[int, int]] = []
    ends: list[int] = []  # the draws taken once that trial is done
    pos = 0
    for _ in range(trials):
        new_w, new_h = widths[pos], heights[pos + 1]
        if not (lo <= new_w / new_h <= hi):
            pos += 2
            continue
        at.append(pos)
        sizes.append((new_w, new_h))
        pos += 4
        ends.append(pos)
    if at:
        where = np.asarray(at)
        new_w, new_h = (np.asarray(v, dtype=np.int64) for v in zip(*sizes, strict=True))
        left = ((width - new_w).astype(_F32) * u[where + 2]).astype(np.int64)
        top = ((height - new_h).astype(_F32) * u[where + 3]).astype(np.int64)
        hit = _first_pass(b, left, top, left + new_w, top + new_h, overlap)
        if hit is not None:
            k, within = hit
            _advance(state, ends[k])
            return dict(
                top=int(top[k]),
                left=int(left[k]),
                height=int(new_h[k]),
                width=int(new_w[k]),
                is_within_crop_area=torch.from_numpy(within),
            )
    _advance(state, pos)
    return None


def _first_pass(
    b: np.ndarray,
    left: np.ndarray,
    top: np.ndarray,
    right: np.ndarray,
    bottom: np.ndarray,
    overlap: float,
) -> tuple[int, np.ndarray] | None:
    """The first crop (of the rows of ``left``...) that passes torchvision's checks: not
    empty, a box centre inside it, and a box inside overlapping it by ``overlap`` or more
    (``box_iou`` in torchvision's float32 steps), with its boxes inside; or None."""
    cx = _F32(0.5) * (b[:, 0] + b[:, 2])
    cy = _F32(0.5) * (b[:, 1] + b[:, 3])
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    x0, y0, x1, y1 = (v[:, None] for v in (left, top, right, bottom))
    within = (x0 < cx) & (cx < x1) & (y0 < cy) & (cy < y1)
    crop = np.stack((left, top, right, bottom), 1).astype(_F32)
    crop_area = (crop[:, 2] - crop[:, 0]) * (crop[:, 3] - crop[:, 1])
    lt = np.maximum(b[None, :, :2], crop[:, None, :2])
    rb = np.minimum(b[None, :, 2:], crop[:, None, 2:])
    wh = np.clip(rb - lt, _F32(0), None)
    inter = wh[..., 0] * wh[..., 1]
    union = area[None, :] + crop_area[:, None] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(within, inter / union, _F32(-np.inf)).max(1, initial=_F32(-np.inf))
    ok = (left != right) & (top != bottom) & within.any(1) & ~(iou < overlap)
    passed = np.flatnonzero(ok)
    if not len(passed):
        return None
    k = int(passed[0])
    return k, np.ascontiguousarray(within[k])


def _advance(state: torch.Tensor, draws: int) -> None:
    """torch's generator back to ``state``, then on by ``draws`` uniform draws."""
    torch.set_rng_state(state)
    if draws:
        torch.rand(draws)
