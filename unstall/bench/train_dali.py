"""DALI's own ResNet input pipeline: the row `bench train` compares the GPU stage with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from unstall.pipeline import ImagePipeline


def dali_own(s: Any, root: str) -> Iterator[Any]:
    """DALI's own ResNet input pipeline over ``root`` (class folders): (images, labels) batches.

    ``readers.file`` (shuffled), ``decoders.image_random_crop`` (RandomResizedCrop's
    ranges; ``mixed`` with DALI's default hardware-decoder share on CUDA, its CPU backend
    otherwise), antialiased bilinear ``resize``, ``crop_mirror_normalize`` with a coin
    flip: float32 CHW, ImageNet mean/std, every CPU core as a DALI thread.
    """
    from nvidia.dali import fn, pipeline_def, types  # type: ignore[import-not-found]
    from nvidia.dali.plugin.pytorch import (  # type: ignore[import-not-found]
        DALIGenericIterator,
        LastBatchPolicy,
    )

    cuda = s.device == "cuda"
    mean = [255 * m for m in ImagePipeline().mean]
    std = [255 * v for v in ImagePipeline().std]

    @pipeline_def(
        batch_size=s.batch_size, num_threads=max(1, s.workers), device_id=0 if cuda else None
    )
    def graph() -> Any:
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(
            jpegs,
            device="mixed" if cuda else "cpu",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
        )
        images = fn.resize(
            images, resize_x=s.image_size, resize_y=s.image_size, antialias=True,
            interp_type=types.INTERP_LINEAR,
        )  # fmt: skip
        images = fn.crop_mirror_normalize(
            images, mirror=fn.random.coin_flip(), mean=mean, std=std, dtype=types.FLOAT,
            output_layout="CHW",
        )  # fmt: skip
        return images, labels

    batches = DALIGenericIterator(
        graph(), ["images", "labels"], reader_name="reader",
        last_batch_policy=LastBatchPolicy.DROP, auto_reset=True,
    )  # fmt: skip
    for (out,) in batches:
        yield out["images"], out["labels"].view(-1).long()
