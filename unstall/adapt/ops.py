"""torchvision's image operations, done on uint8 tensors from encoded bytes, op for op.

`FolderPipeline` is what a recognized torchvision transform becomes when it is not the
standard training pipeline (`unstall.ImagePipeline`: RandomResizedCrop + flip): e.g. the
validation ``Resize(256) + CenterCrop(224)``, or ``RandomCrop``. It decodes at full size
(simplejpeg, bit-identical to PIL's), then runs each geometric op in the script's order
with torchvision's own size rules, on a ``3 x H x W`` uint8 tensor (resizes: torch's
antialiased bilinear uint8 kernel, within a grey level of PIL's), and finishes as the
script's tensor ops did: float32 in 0-1, normalized, or uint8 left for the device.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from unstall.pipeline import batch_seed
from unstall.pipeline.crop import random_resized_crop_box
from unstall.pipeline.decode import decode_jpeg
from unstall.pipeline.transforms import normalize_affine

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Op:
    """One geometric op: ``kind`` (``resize``, ``center_crop``, ``random_crop``,
    ``random_resized_crop``, ``flip``) and its torchvision parameters."""

    kind: str
    size: tuple[int, ...] = ()
    max_size: int | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    p: float = 0.5


class FolderPipeline:
    """Encoded image bytes -> the tensor the script's torchvision transform made.

    Picklable; random draws (crop offsets, flips) come from one stream per batch,
    ``(seed, epoch, batch)`` inside an unstall loader's batch task, as `ImagePipeline`'s.

    Args:
        ops: the geometric ops, in the script's order.
        output: ``"float"`` (float32, ``(x / 255 - mean) / std``) or ``"uint8"``
            (normalized later, on the device).
        mean, std: Normalize's values (0 and 1 where the script had no Normalize).
    """

    def __init__(
        self,
        ops: Sequence[Op],
        *,
        output: str = "float",
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        seed: int | None = None,
    ):
        if output not in ("float", "uint8"):
            raise ValueError(f"output={output!r} must be 'float' or 'uint8'")
        self.ops = tuple(ops)
        self.output = output
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        self.seed = seed
        self._rng: random.Random | None = None
        self._rng_key: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_rng=None, _rng_key=None)
        return state

    def process_rng(self) -> random.Random:
        """The stream of the batch being prepared (``(seed, epoch, batch)``), else per process."""
        batch, generation = batch_seed.current()
        key: Any = ("batch", generation) if batch is not None else ("pid", os.getpid())
        if self._rng is None or self._rng_key != key:
            self._rng = random.Random(f"{self.seed}:batch{batch}" if batch is not None else None)
            self._rng_key = key
        return self._rng

    def __call__(self, data: bytes) -> torch.Tensor:
        image = torch.from_numpy(decode_jpeg(data)).permute(2, 0, 1)
        return self.finish(self.geometry(image, self.process_rng()))

    def geometry(self, image: torch.Tensor, rng: random.Random) -> torch.Tensor:
        """Run the geometric ops on a ``3 x H x W`` uint8 tensor, drawing from ``rng``."""
        for op in self.ops:
            image = _apply(op, image, rng)
        return image.contiguous()

    def finish(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 as it is, or float32 scaled and normalized (one multiply, one add)."""
        if self.output == "uint8":
            return image
        mul, add = normalize_affine(self.mean, self.std, _CPU)
        return image.to(torch.float32).mul_(mul).add_(add)

    def __repr__(self) -> str:
        kinds = ", ".join(op.kind for op in self.ops)
        return f"FolderPipeline([{kinds}], output={self.output!r})"


def _apply(op: Op, image: torch.Tensor, rng: random.Random) -> torch.Tensor:
    _, h, w = image.shape
    if op.kind == "resize":
        return _resize(image, resized_size(h, w, op.size, op.max_size))
    if op.kind == "center_crop":
        return center_crop(image, op.size)
    if op.kind == "random_crop":
        th, tw = op.size
        if h < th or w < tw:
            raise ValueError(f"RandomCrop size {op.size} is larger than the image ({h}x{w})")
        top, left = rng.randint(0, h - th), rng.randint(0, w - tw)
        return image[:, top : top + th, left : left + tw]
    if op.kind == "random_resized_crop":
        left, top, cw, ch = random_resized_crop_box(w, h, rng, scale=op.scale, ratio=op.ratio)
        return _resize(image[:, top : top + ch, left : left + cw], (op.size[0], op.size[1]))
    if op.kind == "flip":
        return image.flip(-1) if rng.random() < op.p else image
    raise ValueError(f"unknown op {op.kind!r}")


def resized_size(h: int, w: int, size: tuple[int, ...], max_size: int | None) -> tuple[int, int]:
    """torchvision's ``Resize`` output size: ``(h, w)`` given, or the shorter side to ``size``."""
    if len(size) == 2:
        return size[0], size[1]
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size[0], int(size[0] * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if w <= h else (new_short, new_long)


def center_crop(image: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """torchvision's ``CenterCrop``: zero-padded where the image is smaller, then centred."""
    th, tw = size
    _, h, w = image.shape
    if th > h or tw > w:
        pad_l, pad_t = (tw - w) // 2 if tw > w else 0, (th - h) // 2 if th > h else 0
        pad_r, pad_b = (tw - w + 1) // 2 if tw > w else 0, (th - h + 1) // 2 if th > h else 0
        image = F.pad(image, (pad_l, pad_r, pad_t, pad_b))
        _, h, w = image.shape
        if (h, w) == (th, tw):
            return image
    top, left = round((h - th) / 2.0), round((w - tw) / 2.0)
    return image[:, top : top + th, left : left + tw]


def _resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(image.shape[1:]) == size:
        return image
    out = F.interpolate(
        image.unsqueeze(0), size=size, mode="bilinear", antialias=True, align_corners=False
    )
    return out[0]
