"""One resampling step from the decoded image to the output: pads, crops, flips and resizes
composed per axis into one banded weight matrix, applied once.

A detection pipeline's geometry is separable: every op (``RandomZoomOut``'s pad,
``RandomIoUCrop``'s crop, flips, resizes) maps output rows to input rows and output columns
to input columns independently. `axis_taps` walks an axis's chain of ops backwards from the
output grid: integer ops (pad, crop, flip) move indices, a resize spreads each index over
its filter taps with torch's antialiased bilinear weights (`aa_weights`, the weights of
``F.interpolate(..., mode="bilinear", antialias=True)``, which torchvision's ``Resize`` runs
on tensors), and an index that lands in a pad (the zoom-out canvas) gets weight 0: the fill
takes the rest of that output pixel's weight. `resample` then makes the output in two passes
over the source rows it needs (columns, then rows), never painting the canvas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: One op of an axis's chain: ``("pad", before, after)``, ``("crop", offset, size)``,
#: ``("flip",)`` or ``("resize", size)``, with the grid size it reads (``n_in``).
AxisOp = tuple[str, int, tuple[int, ...]]


@dataclass(frozen=True)
class Taps:
    """Per output index: source indices ``index`` (n, K) and weights ``weight`` (n, K);
    ``1 - weight.sum(1)`` is the fill's share (the canvas where no image is)."""

    index: torch.Tensor
    weight: torch.Tensor

    @property
    def coverage(self) -> torch.Tensor:
        """The image's share of each output index (1 inside the image, 0 in the fill)."""
        return self.weight.sum(1)


def aa_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's antialiased bilinear taps from ``n_in`` to ``n_out`` samples: ``(index,
    weight)``, each ``(n_out, K)`` (PyTorch's ``_compute_indices_weights_aa``)."""
    scale = n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(n_out) + 0.5)
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), n_in)
    size = xmax - xmin
    k = int(size.max())
    j = np.arange(k)[None, :]
    weight = np.clip(1.0 - np.abs((j + xmin[:, None] - center[:, None] + 0.5) * invscale), 0, None)
    weight = np.where(j < size[:, None], weight, 0.0)
    weight /= weight.sum(1, keepdims=True)
    index = np.minimum(xmin[:, None] + j, n_in - 1)
    return index, weight


def axis_taps(chain: Sequence[AxisOp], n_out: int) -> Taps:
    """The taps of output indices ``0..n_out-1`` in the source, through ``chain`` (the axis's
    ops from the source to the output, each with the size of the grid it reads)."""
    index = np.arange(n_out, dtype=np.int64)[:, None]
    weight = np.ones((n_out, 1))
    for kind, n_in, args in reversed(chain):
        if kind == "pad":
            index = index - args[0]
        elif kind == "crop":
            index = index + args[0]
        elif kind == "flip":
            index = n_in - 1 - index
        elif kind == "resize":
            ti, tw = aa_weights(n_in, args[0])
            n = index.shape[0]
            index, weight = ti[index].reshape(n, -1), (weight[..., None] * tw[index]).reshape(n, -1)
        else:
            raise ValueError(f"unknown axis op {kind!r}")
        inside = (index >= 0) & (index < n_in)
        weight = np.where(inside, weight, 0.0)
        index = np.clip(index, 0, n_in - 1)
        if kind == "resize":
            index, weight = _merge(index, weight)
            index = np.clip(index, 0, n_in - 1)  # a band's ends past the edge weigh 0
    return Taps(torch.from_numpy(index), torch.from_numpy(weight.astype(np.float32)))


def reduce_taps(taps: Taps, scale: int, n_small: int) -> Taps:
    """``taps`` into a source decoded at ``1/scale`` (``n_small`` samples): the weight of
    full-size index ``i`` goes to decoded index ``i // scale`` (the DCT-scaled pixel is the
    mean of the ``scale`` pixels it covers)."""
    index = np.minimum(taps.index.numpy() // scale, n_small - 1)
    index, weight = _merge(index, taps.weight.numpy().astype(np.float64))
    index = np.clip(index, 0, n_small - 1)
    return Taps(torch.from_numpy(index), torch.from_numpy(weight.astype(np.float32)))


def _merge(index: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's taps as one band (index ``first + k``), the weights of a repeated index
    summed (two resizes in a row read the same source index several times), and the
    columns no row uses dropped."""
    n = index.shape[0]
    live = weight != 0
    first = np.where(live, index, np.iinfo(np.int64).max).min(1)
    first = np.where(live.any(1), first, 0)
    rel = np.where(live, index - first[:, None], 0)
    band = np.zeros((n, int(rel.max()) + 1))
    np.add.at(band, (np.repeat(np.arange(n), index.shape[1]), rel.ravel()), weight.ravel())
    used = (band != 0).any(0)
    band = band[:, used] if used.any() else band[:, :1]
    offsets = np.arange(used.size)[used] if used.any() else np.zeros(1, dtype=np.int64)
    return first[:, None] + offsets[None, :], band


def resample(source: torch.Tensor, rows: Taps, cols: Taps) -> torch.Tensor:
    """``C x H x W`` source (any dtype) -> ``C x h x w`` float32 on the source's scale: the
    image's part of each output pixel (add ``fill * (1 - coverage)`` for the canvas).

    Only the output rows and columns the image reaches are computed, from the source rows
    and columns their taps read: rows by gathering whole source rows, columns after one
    transpose, also by gathering rows (both contiguous copies, not per-element gathers)."""
    channels = source.shape[0]
    out = torch.zeros(channels, rows.index.shape[0], cols.index.shape[0])
    y = _span(rows)
    x = _span(cols)
    if y is None or x is None:
        return out
    (o0, o1, s0, s1), (p0, p1, t0, t1) = y, x
    part = source[:, s0:s1, t0:t1]  # C x Hs x Ws, a view: the gathers convert it
    down = _gather(part, 1, rows.index[o0:o1] - s0, rows.weight[o0:o1])  # C x R x Ws
    flat = down.reshape(channels * (o1 - o0), t1 - t0).t().contiguous()  # Ws x C*R
    across = _gather(flat, 0, cols.index[p0:p1] - t0, cols.weight[p0:p1])  # Q x C*R
    out[:, o0:o1, p0:p1] = across.t().reshape(channels, o1 - o0, p1 - p0)
    return out


def _span(taps: Taps) -> tuple[int, int, int, int] | None:
    """``(first, end)`` of the output indices the image reaches and of the source indices
    their taps read; None where the image reaches none."""
    reach = (taps.weight != 0).any(1).nonzero().flatten()
    if reach.numel() == 0:
        return None
    o0, o1 = int(reach[0]), int(reach[-1]) + 1
    used = taps.weight[o0:o1] != 0
    index = taps.index[o0:o1][used]
    return o0, o1, int(index.min()), int(index.max()) + 1


def _gather(data: torch.Tensor, dim: int, index: torch.Tensor, weight: torch.Tensor):
    """``sum_k data.index_select(dim, index[:, k]) * weight[:, k]`` (weights broadcast along
    ``dim``), skipping taps no output uses."""
    n = index.shape[0]
    index = index.clamp(0, data.shape[dim] - 1)
    total = None
    for k in range(index.shape[1]):
        w = weight[:, k]
        if not bool((w != 0).any()):
            continue
        shape = [1] * data.dim()
        shape[dim] = n
        term = data.index_select(dim, index[:, k])
        if total is None:
            total = term.mul(w.view(shape))  # float32, whatever the data's dtype
        else:
            total.addcmul_(term, w.view(shape))
    assert total is not None
    return total


def shift(chain: Sequence[AxisOp], n_out: int, n_src: int) -> tuple[int, int, int, int, bool]:
    """An axis with no resize: output ``[o0, o1)`` shows source ``[s0, s1)``, reversed where
    ``flipped``; ``(o0, o1, s0, s1, flipped)`` (``o0 == o1``: the image is not in view)."""
    sign, offset = 1, 0  # source index = sign * output index + offset
    for kind, n_in, args in reversed(chain):
        if kind == "pad":
            offset -= args[0]
        elif kind == "crop":
            offset += args[0]
        elif kind == "flip":
            offset, sign = n_in - 1 - offset, -sign
        else:
            raise ValueError(f"shift() takes integer ops only, not {kind!r}")
    # output j shows source sign * j + offset, inside [0, n_src)
    ends = sorted(((0 - offset) * sign, (n_src - 1 - offset) * sign))
    o0, o1 = max(ends[0], 0), min(ends[1] + 1, n_out)
    if o0 >= o1:
        return 0, 0, 0, 0, False
    s_a, s_b = sign * o0 + offset, sign * (o1 - 1) + offset
    return o0, o1, min(s_a, s_b), max(s_a, s_b) + 1, sign < 0


def paste(
    source: torch.Tensor,
    rows: Sequence[AxisOp],
    cols: Sequence[AxisOp],
    size: tuple[int, int],
    fill: torch.Tensor,
    colour: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The output of integer-only chains (pads, crops, flips: no resampling): a canvas of
    ``fill`` with the source's visible part copied in once, ``colour`` applied to that part
    first (the photometric ops of a pipeline that distorts before its geometry)."""
    h, w = size
    channels = source.shape[0]
    oy0, oy1, sy0, sy1, fy = shift(rows, h, source.shape[1])
    ox0, ox1, sx0, sx1, fx = shift(cols, w, source.shape[2])
    dims = [d for d, f in ((1, fy), (2, fx)) if f]
    part = source[:, sy0:sy1, sx0:sx1]
    if (oy0, oy1, ox0, ox1) == (0, h, 0, w):  # no canvas in view: the part is the output
        part = colour(part) if colour is not None else part
        return part.flip(dims) if dims else part
    out = torch.empty((channels, h, w), dtype=source.dtype)
    for c, value in enumerate(fill.flatten().tolist()):
        out[c].fill_(value)
    if oy0 == oy1 or ox0 == ox1:
        return out
    part = colour(part) if colour is not None else part
    out[:, oy0:oy1, ox0:ox1] = part.flip(dims) if dims else part
    return out
