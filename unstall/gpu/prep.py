"""The encoded part of a batch, as the GPU stage's engines take it, and the crops drawn for it.

Workers (`unstall.gpu.split.SplitView`) read only each JPEG's header to draw its
RandomResizedCrop box and flip from the pipeline's own random stream (same ranges,
same order of draws, same seeding as `ImagePipeline`), so caches, object stores and
coordination keep working unchanged; `_encode` packs a batch's bytes into one uint8
tensor (which zero-copy slots carry) with the boxes, flips and sample indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from unstall.pipeline.crop import Box

#: Key of the encoded bytes in a collated encoded batch (a dict).
ENCODED = "unstall_encoded"


@dataclass(frozen=True)
class EncodedImage:
    """One sample as the GPU stage's workers leave it: bytes plus the augmentation drawn for it."""

    data: bytes
    box: Box
    flip: bool
    index: int


def draw(pipeline: Any, data: bytes) -> tuple[Box, bool]:
    """The crop box and flip ``pipeline`` would use for ``data``, drawn from its stream.

    The box is drawn on the stored (unrotated) size: no engine applies EXIF orientation.
    """
    return pipeline.draw(data)  # the pipeline's own stream and draw (seeded as on the CPU)


def _encode(images: list[EncodedImage]) -> dict[str, torch.Tensor]:
    """A batch's encoded images as one dict of tensors: bytes, offsets, boxes, flips, indices."""
    sizes = np.fromiter((len(im.data) for im in images), dtype=np.int64, count=len(images))
    offsets = np.zeros(len(images) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for im, start, end in zip(images, offsets[:-1], offsets[1:], strict=True):
        data[start:end] = np.frombuffer(im.data, dtype=np.uint8)
    return {
        ENCODED: torch.from_numpy(data),
        "offsets": torch.from_numpy(offsets),
        "boxes": torch.tensor([im.box for im in images], dtype=torch.int64).view(-1, 4),
        "flips": torch.tensor([im.flip for im in images], dtype=torch.bool),
        "indices": torch.tensor([im.index for im in images], dtype=torch.int64),
    }
