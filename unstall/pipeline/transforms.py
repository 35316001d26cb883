"""The standard image training pipeline: decode, RandomResizedCrop, flip, to tensor, normalize.

Same semantics as torchvision's ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``
+ ``ToTensor()`` + ``Normalize()``, reordered for speed: the crop box is drawn from the
image header first, the JPEG is decoded at the smallest DCT scale that keeps the
crop at least the output size, and the crop is resized with torch's uint8 kernel.

`unstall bench prep` measures this pipeline against torchvision's way
(`TorchReferencePipeline`) in the same run, float32 and uint8.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils.data

from unstall.pipeline import batch_seed
from unstall.pipeline.crop import (
    Box,
    dct_scale,
    random_resized_crop_box,
    resize_crop,
    scale_box,
)
from unstall.pipeline.decode import decode_jpeg, image_size

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OUTPUTS = ("float", "uint8")
_CPU = torch.device("cpu")


class ImagePipeline:
    """Encoded image bytes -> ``3 x size x size`` tensor, the usual ImageNet training augmentation.

    Picklable and cheap to build, so it can be sent to every worker. Random state is
    per process: a copy in a forked or spawned worker re-seeds itself on first use.

    Args:
        size: output side in pixels, or ``(height, width)``.
        output: ``"float"``: float32, normalized with ``mean``/``std``. ``"uint8"``: the
            "lean" batch, 4x smaller, un-normalized; finish it on the accelerator with
            `normalize_batch` (or `ImagePipeline.normalize`).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height), drawn log-uniformly.
        flip_p: probability of a horizontal flip.
        mean, std: per-channel normalization, in 0-1 pixel units.
        seed: make the augmentations reproducible: the same stream in the process that
            built the pipeline; in a torch DataLoader worker, a stream derived from
            ``seed`` and the worker's seed (so it differs per worker and per epoch).
            None: fresh entropy per process (a torch worker uses its worker seed).
    """

    def __init__(
        self,
        size: int | tuple[int, int] = 224,
        *,
        output: str = "float",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        seed: int | None = None,
    ):
        self.size = _check_size(size)
        if output not in OUTPUTS:
            raise ValueError(f"output={output!r} must be one of {OUTPUTS}")
        self.output = output
        self.scale = _check_range("scale", scale)
        self.ratio = _check_range("ratio", ratio)
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p={flip_p!r} must be a probability in [0, 1]")
        self.flip_p = float(flip_p)
        self.mean, self.std = _check_mean_std(mean, std)
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed={seed!r} must be a non-negative int or None")
        self.seed = seed
        self._origin_pid = os.getpid()
        self._rng: random.Random | None = None
        self._rng_pid = -1

    def __call__(self, data: bytes) -> torch.Tensor:
        """Augment one encoded image; raises `DecodeError` (a ValueError) for corrupt bytes."""
        box, flip = self.draw(data)
        return self.apply(data, box, flip=flip)

    def draw(self, data: bytes) -> tuple[Box, bool]:
        """The crop box and flip for ``data``, drawn from this pipeline's stream (header only):
        the one draw the CPU path and the GPU stage's workers share."""
        rng = self.process_rng()
        width, height = image_size(data)
        box = random_resized_crop_box(width, height, rng, scale=self.scale, ratio=self.ratio)
        return box, rng.random() < self.flip_p

    def apply(self, data: bytes, box: Box, *, flip: bool = False, dct: bool = True) -> torch.Tensor:
        """The deterministic part: decode, crop ``box`` (left, top, width, height), resize, flip.

        ``dct=False`` decodes at full size (for comparisons); where the DCT scale is
        above 1 the two differ by 1-2 grey levels on average (a different low-pass filter).
        """
        full = image_size(data)
        scale = dct_scale(box, self.size) if dct else 1
        image = decode_jpeg(data, scale=scale)
        decoded = (image.shape[1], image.shape[0])
        out = resize_crop(image, scale_box(box, full, decoded), self.size)
        if flip:
            out = out.flip(-1)
        if self.output == "uint8":
            return out
        mul, add = normalize_affine(self.mean, self.std, _CPU)
        return out.to(torch.float32).mul_(mul).add_(add)

    def normalize(
        self, batch: torch.Tensor, *, device: Any = None, channels_last: bool = False
    ) -> torch.Tensor:
        """`normalize_batch` with this pipeline's ``mean`` and ``std``."""
        return normalize_batch(
            batch, mean=self.mean, std=self.std, device=device, channels_last=channels_last
        )

    def __repr__(self) -> str:
        return (
            f"ImagePipeline(size={self.size}, output={self.output!r}, scale={self.scale}, "
            f"ratio={self.ratio}, flip_p={self.flip_p}, seed={self.seed})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_rng=None, _rng_pid=-1)  # rebuilt where it lands
        return state

    def process_rng(self) -> random.Random:
        """This pipeline's random stream here: per batch (``(seed, epoch, batch)``) inside a
        loader's batch task, else per process; the GPU stage draws its crops from it too."""
        batch, generation = batch_seed.current()
        if batch is not None:  # a loader's batch: the stream follows (seed, epoch, batch) only
            if self._rng is None or self._rng_pid != -2 - generation:
                self._rng = random.Random(f"{self.seed}:batch{batch}")
                self._rng_pid = -2 - generation
            return self._rng
        pid = os.getpid()
        if self._rng is None or self._rng_pid != pid:
            self._rng = random.Random(_stream_seed(self.seed, pid == self._origin_pid))
            self._rng_pid = pid
        return self._rng


def normalize_batch(
    batch: torch.Tensor,
    *,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    device: Any = None,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Turn a uint8 ``N x 3 x H x W`` batch into normalized floats, on ``device``.

    What ``ImagePipeline(output="float")`` does per image, done once per batch where
    it is cheap (the accelerator): the batch crosses the bus as uint8, 4x smaller.
    ``channels_last`` converts the layout while still uint8, for convolution nets.
    """
    if batch.dtype != torch.uint8:
        raise ValueError(
            f"batch has dtype {batch.dtype}, expected torch.uint8: normalize_batch takes "
            'ImagePipeline(output="uint8") batches; float batches are already normalized'
        )
    mean, std = _check_mean_std(mean, std)
    if batch.dim() != 4 or batch.shape[1] != len(mean):
        raise ValueError(
            f"batch has shape {tuple(batch.shape)}, expected (N, {len(mean)}, H, W): "
            "a collated batch of CHW images"
        )
    if device is not None:
        batch = batch.to(device, non_blocking=True)
    if channels_last:
        batch = batch.contiguous(memory_format=torch.channels_last)
    mul, add = normalize_affine(tuple(mean), tuple(std), batch.device)
    out = batch.to(torch.float32).mul_(mul).add_(add)
    return out if dtype == torch.float32 else out.to(dtype)


@functools.lru_cache(maxsize=16)
def normalize_affine(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x * mul + add`` == ``(x / 255 - mean) / std``, one multiply and one add per value.

    Cached per device: read-only tensors, shared by every call.
    """
    m = torch.tensor(mean, dtype=torch.float64)
    s = torch.tensor(std, dtype=torch.float64)
    mul = (1.0 / (255.0 * s)).to(torch.float32).view(-1, 1, 1)
    add = (-m / s).to(torch.float32).view(-1, 1, 1)
    return mul.to(device), add.to(device)


def _stream_seed(seed: int | None, in_origin: bool) -> int | str | None:
    worker = torch.utils.data.get_worker_info()
    if worker is not None:  # base seed + worker id: differs per worker and per epoch
        return f"{seed}:{worker.seed}"
    if seed is None:
        return None  # os.urandom
    return seed if in_origin else f"{seed}:pid{os.getpid()}"


def _check_size(size: int | tuple[int, int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"size={size!r} must be a positive int or (height, width) of them")
    return pair[0], pair[1]


def _check_range(name: str, bounds: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in bounds)
    if not 0 < lo <= hi:
        raise ValueError(f"{name}={bounds!r} must be (low, high) with 0 < low <= high")
    return lo, hi


def _check_mean_std(
    mean: Sequence[float], std: Sequence[float]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    m, s = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if len(m) != 3 or len(s) != 3:
        raise ValueError(f"mean={mean!r} and std={std!r} must have 3 values (R, G, B) each")
    if min(s) <= 0:
        raise ValueError(f"std={std!r} must be positive")
    return m, s
