"""GPU preparation: workers fetch bytes and draw crops; the device decodes and augments batches.

Workers run `EncodedView.prepare`, which reads only the JPEG header to draw the
RandomResizedCrop box and flip from the pipeline's own random stream (same
ranges, same order of draws, same seeding as `ImagePipeline`), so caches,
object stores and coordination keep working unchanged. `collate_encoded` packs
a batch's bytes into one uint8 tensor (which zero-copy slots carry); `GpuPrep`
decodes it on the device and crops, flips and normalizes it in one batched pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data

from unstall.errors import SampleError
from unstall.gpu.augment import box_inside, crop_flip_normalize
from unstall.gpu.decode import GpuDecoder
from unstall.pipeline.crop import Box, random_resized_crop_box
from unstall.pipeline.decode import decode_jpeg, image_size

#: Key of the encoded bytes in a collated encoded batch (a dict).
ENCODED = "unstall_encoded"


@dataclass(frozen=True)
class EncodedImage:
    """One sample as GPU prep's workers leave it: bytes plus the augmentation drawn for it."""

    data: bytes
    box: Box
    flip: bool
    index: int


def draw(pipeline: Any, data: bytes) -> tuple[Box, bool]:
    """The crop box and flip ``pipeline`` would use for ``data``, drawn from its stream."""
    rng = pipeline._process_rng()  # the pipeline's per-process stream (seeded as on the CPU)
    width, height = image_size(data)
    box = random_resized_crop_box(width, height, rng, scale=pipeline.scale, ratio=pipeline.ratio)
    return box, rng.random() < pipeline.flip_p


class EncodedView:
    """A `FileDataset` whose `ImagePipeline` only draws crops: what GPU prep's workers load.

    ``fetch`` and ``key`` are the dataset's own (and anything else it has, e.g. for
    caches); ``prepare`` yields ``(EncodedImage, label)``, or an `EncodedImage`.
    """

    def __init__(self, dataset: Any, pipeline: Any):
        self.dataset = dataset
        self.pipeline = pipeline

    def __len__(self) -> int:
        return len(self.dataset)

    def key(self, index: int) -> str:
        return self.dataset.key(index)

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        return self.dataset.fetch(indices)

    def prepare(self, index: int, raw: bytes) -> Any:
        try:
            box, flip = draw(self.pipeline, raw)
        except Exception as exc:
            key = self.dataset.key(index)
            raise SampleError(
                f"cannot prepare sample {index} (key {key!r}): {type(exc).__name__}: {exc}",
                index=index,
                key=key,
            ) from exc
        image = EncodedImage(bytes(raw), box, flip, index)
        labels = getattr(self.dataset, "labels", None)
        return image if labels is None else (image, int(labels[index]))

    def __getitem__(self, index: int) -> Any:
        return self.prepare(index, self.fetch([index])[0])

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "pipeline") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def collate_encoded(samples: list[Any]) -> Any:
    """Collate `EncodedImage` samples (optionally with labels) into a dict of tensors."""
    if type(samples[0]) is tuple:
        images = [s[0] for s in samples]
        rest = torch.utils.data.default_collate([s[1:] for s in samples])
        return [_encode(images), *rest]
    return _encode(samples)


def _encode(images: list[EncodedImage]) -> dict[str, torch.Tensor]:
    sizes = np.fromiter((len(im.data) for im in images), dtype=np.int64, count=len(images))
    offsets = np.zeros(len(images) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for im, start, end in zip(images, offsets[:-1], offsets[1:], strict=True):
        data[start:end] = np.frombuffer(im.data, dtype=np.uint8)
    return {
        ENCODED: torch.from_numpy(data),
        "offsets": torch.from_numpy(offsets),
        "boxes": torch.tensor([im.box for im in images], dtype=torch.int64),
        "flips": torch.tensor([im.flip for im in images], dtype=torch.bool),
        "indices": torch.tensor([im.index for im in images], dtype=torch.int64),
    }


class GpuPrep:
    """Decode + crop + flip + normalize an encoded batch on ``device``; labels copied along.

    Images the decoder rejects (or returns in a size that does not hold the crop box)
    are decoded on the CPU; if that fails too, a `SampleError` names the index and key.
    """

    def __init__(
        self,
        pipeline: Any,
        decoder: GpuDecoder,
        *,
        key_of: Callable[[int], str] | None = None,
        channels_last: bool = False,
    ):
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.decoder = decoder
        self.key_of = key_of
        self.channels_last = channels_last

    def __call__(self, batch: Any, device: torch.device) -> Any:
        if type(batch) is list:
            return [self.images(batch[0], device), *(_to(x, device) for x in batch[1:])]
        return self.images(batch, device)

    def images(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        data, bounds = encoded[ENCODED], encoded["offsets"].tolist()
        jpegs = [data[a:b] for a, b in itertools.pairwise(bounds)]
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        decoded = self.decoder.decode(jpegs, device, stream)
        indices, boxes = encoded["indices"].tolist(), encoded["boxes"].tolist()
        images = [
            im if _holds(im, boxes[i]) else self._on_cpu(jpegs[i], indices[i], device)
            for i, im in enumerate(decoded)
        ]
        return crop_flip_normalize(
            images,
            encoded["boxes"],
            encoded["flips"],
            self.size,
            mean=self.mean,
            std=self.std,
            channels_last=self.channels_last,
        )

    def _on_cpu(self, jpeg: torch.Tensor, index: int, device: torch.device) -> torch.Tensor:
        try:
            image = decode_jpeg(jpeg.numpy().tobytes())
        except ValueError as exc:
            key = self.key_of(index) if self.key_of is not None else None
            raise SampleError(
                f"cannot decode sample {index} (key {key!r}) with {self.decoder.name} "
                f"or on the CPU: {exc}",
                index=index,
                key=key,
            ) from exc
        return torch.from_numpy(image).permute(2, 0, 1).to(device)


def _holds(image: torch.Tensor | None, box: list[int]) -> bool:
    """Whether a decoded image holds its crop box (a decoder that rotated it does not)."""
    return image is not None and box_inside(box, image.shape[-2], image.shape[-1])


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x
