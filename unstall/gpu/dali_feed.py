"""What the GPU stage's thread hands DALI for one batch, and takes back: few calls, no copies.

A batch's encoded bytes arrive as one uint8 buffer and its offsets (`unstall.gpu.prep`
layout, in the zero-copy slot the workers wrote). ``feed="tensors"`` (the default)
wraps each sample's byte range in a DALI ``TensorCPU`` (made in DALI's C++, no copy)
and hands DALI one ``TensorListCPU`` of them; the crop boxes and flips go as one
``N x 5`` float32 array (the graph slices it). Two ``feed_input`` calls per batch, no
per-sample work in Python beyond the wrapping. ``feed="arrays"`` is the path DALI
documents and unstall used before: one numpy array per sample, checked and converted
one by one in ``feed_input``'s Python (``unstall bench gpufeed`` measures both in
one run). Outputs are copied once into a torch tensor (``copy_to_external``: an
asynchronous device copy on the caller's stream with CUDA, a memcpy without).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from unstall.gpu.prep import ENCODED

#: How a batch's bytes are handed to DALI: per-sample DALI tensors in one list, or numpy arrays.
FEEDS = ("tensors", "arrays")
#: External sources of the graph: the encoded bytes, and boxes (x, y, w, h) + flip per sample.
JPEGS, CROPS = "jpegs", "crops"


def batch_inputs(encoded: dict[str, torch.Tensor], feed: str = "tensors") -> tuple[Any, Any]:
    """``(jpegs, crops)`` for one batch; referenced until DALI's output for it is taken
    (the graph reads the bytes in place: ``no_copy``)."""
    data = encoded[ENCODED].numpy()
    bounds = encoded["offsets"].tolist()
    if feed == "arrays":
        jpegs: Any = np.split(data, bounds[1:-1])
    elif feed == "tensors":
        from nvidia.dali.tensors import TensorCPU, TensorListCPU  # type: ignore[import-not-found]

        parts = [TensorCPU(data[a:b]) for a, b in itertools.pairwise(bounds)]
        jpegs = TensorListCPU(parts, None, False)  # not contiguous: no copy
    else:
        raise ValueError(f"feed={feed!r} must be one of {FEEDS}")
    n = len(bounds) - 1
    crops = np.empty((n, 5), dtype=np.float32)
    crops[:, :4] = encoded["boxes"].numpy()
    crops[:, 4] = encoded["flips"].numpy()
    return jpegs, crops


def feed(pipe: Any, inputs: tuple[Any, Any]) -> None:
    """One batch's inputs into ``pipe``'s external sources."""
    jpegs, crops = inputs
    pipe.feed_input(JPEGS, jpegs)
    pipe.feed_input(CROPS, crops)


def graph_inputs(fn: Any, types: Any) -> tuple[Any, Any, Any, Any]:
    """The graph's external sources: ``(jpegs, anchor, shape, mirror)`` DataNodes."""
    jpegs = fn.external_source(name=JPEGS, dtype=types.UINT8, ndim=1, no_copy=True)
    crops = fn.external_source(name=CROPS, dtype=types.FLOAT, ndim=1)
    mirror = fn.cast(crops[4], dtype=types.INT32)
    return jpegs, crops[0:2], crops[2:4], mirror


def to_torch(out: Any, n: int, size: tuple[int, int], device: torch.device, stream: Any) -> Any:
    """DALI's dense ``N x 3 x H x W`` float output copied once into a new torch tensor."""
    from nvidia.dali.plugin.pytorch import feed_ndarray  # type: ignore[import-not-found]

    images = torch.empty((n, 3, *size), dtype=torch.float32, device=device)
    feed_ndarray(out.as_tensor(), images, cuda_stream=stream)
    return images
