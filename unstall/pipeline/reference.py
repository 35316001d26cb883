"""What a typical torch user runs, re-written with PIL + torch only: the benchmarks' baseline.

Mirrors torchvision (v1 transforms on PIL images) op for op: ``pil_loader``
(``Image.open().convert("RGB")``), ``RandomResizedCrop(size)`` (full decode, crop,
PIL bilinear resize), ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize()``;
randomness comes from torch's global generator, as in torchvision.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from unstall.pipeline.crop import Box
from unstall.pipeline.transforms import IMAGENET_MEAN, IMAGENET_STD, _check_mean_std, _check_size


class TorchReferencePipeline:
    """torchvision's standard training transform on encoded bytes, without torchvision.

    Args:
        size: output side in pixels, or ``(height, width)``.
        scale, ratio: RandomResizedCrop's area fraction and aspect-ratio ranges.
        mean, std: Normalize's per-channel values.
    """

    def __init__(
        self,
        size: int | tuple[int, int] = 224,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ):
        self.size = _check_size(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.mean, self.std = _check_mean_std(mean, std)

    def __call__(self, data: bytes) -> torch.Tensor:
        """Decode, RandomResizedCrop, flip with p=0.5, ToTensor, Normalize."""
        image = Image.open(io.BytesIO(data)).convert("RGB")
        box = self.get_params(image.width, image.height)
        flip = bool(torch.rand(1) < 0.5)
        return self._finish(image, box, flip)

    def apply(self, data: bytes, box: Box, *, flip: bool = False) -> torch.Tensor:
        """The deterministic part, for a given ``box`` (left, top, width, height) and flip."""
        return self._finish(Image.open(io.BytesIO(data)).convert("RGB"), box, flip)

    def get_params(self, width: int, height: int) -> Box:
        """``RandomResizedCrop.get_params`` as torchvision writes it, as (left, top, w, h)."""
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w = round(math.sqrt(target_area * aspect_ratio))
            h = round(math.sqrt(target_area / aspect_ratio))
            if 0 < w <= width and 0 < h <= height:
                i = int(torch.randint(0, height - h + 1, size=(1,)).item())
                j = int(torch.randint(0, width - w + 1, size=(1,)).item())
                return j, i, w, h
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def _finish(self, image: Image.Image, box: Box, flip: bool) -> torch.Tensor:
        left, top, w, h = box
        # F.resized_crop on PIL: crop, then resize to (width, height), bilinear.
        image = image.crop((left, top, left + w, top + h))
        image = image.resize((self.size[1], self.size[0]), Image.BILINEAR)
        if flip:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        # ToTensor
        array = np.array(image, np.uint8, copy=True)
        tensor = torch.from_numpy(array).view(image.size[1], image.size[0], 3)
        tensor = tensor.permute((2, 0, 1)).contiguous().to(torch.float32).div(255)
        # Normalize (not in place: torchvision clones first)
        mean = torch.as_tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        return tensor.clone().sub_(mean).div_(std)
