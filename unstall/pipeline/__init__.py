"""Image preparation: fast decode, RandomResizedCrop + flip + normalize, and torch's baseline."""

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
