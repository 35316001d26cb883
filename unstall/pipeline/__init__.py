"""Image preparation: fast decode, RandomResizedCrop + flip + normalize, and torch's baseline.

Names load on first use: the loader imports `unstall.pipeline.batch_seed` for every
batch task, and must not pay for the image decoders (PIL, simplejpeg) unless images
are prepared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

_HOMES = {
    "IMAGENET_MEAN": "unstall.pipeline.transforms",
    "IMAGENET_STD": "unstall.pipeline.transforms",
    "DecodeError": "unstall.pipeline.decode",
    "ImagePipeline": "unstall.pipeline.transforms",
    "TorchReferencePipeline": "unstall.pipeline.reference",
    "decode_jpeg": "unstall.pipeline.decode",
    "image_size": "unstall.pipeline.decode",
    "normalize_batch": "unstall.pipeline.transforms",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


if TYPE_CHECKING:
    from unstall.pipeline.decode import DecodeError, decode_jpeg, image_size
    from unstall.pipeline.reference import TorchReferencePipeline
    from unstall.pipeline.transforms import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        ImagePipeline,
        normalize_batch,
    )

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DecodeError",
    "ImagePipeline",
    "TorchReferencePipeline",
    "decode_jpeg",
    "image_size",
    "normalize_batch",
]
