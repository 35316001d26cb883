"""The GPU stage's one interface: an encoded batch in, normalized float images out.

An engine takes the packed encoded part of a batch (`unstall.gpu.prep` layout:
bytes, offsets, crop boxes, flips, indices) and returns ``N x 3 x H x W`` float32
images on the device, decoded, cropped, flipped, resized and normalized as a
batch. Two engines: `DaliEngine` (NVIDIA DALI: native threads without the GIL,
its own CUDA streams in this process's context, the hardware JPEG decoder where
the GPU has one; its CPU backend without a GPU) and `TorchEngine` (a batch
decoder, nvImageCodec, torchvision's nvJPEG or unstall's CPU decoder, then
`crop_flip_normalize`). `pick_engine` chooses; `available_decoder` names the best
importable one for `unstall analyze`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch

from unstall.gpu.decode import GpuDecoder, cpu_decoder, pick_decoder
from unstall.gpu.prep import GpuPrep

#: Environment variable naming the engine to use (``dali`` or ``torch``); unset: best available.
ENGINE_ENV = "UNSTALL_PREP_ENGINE"
ENGINES = ("dali", "torch")


class Engine(Protocol):
    """Prepares the encoded part of a batch on ``device`` (see module doc)."""

    name: str

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor: ...

    def close(self) -> None: ...


class TorchEngine:
    """A batch JPEG decoder, then one batched crop/flip/resize/normalize (`GpuPrep`)."""

    def __init__(self, pipeline: Any, decoder: GpuDecoder, *, key_of: Callable[[int], str]):
        self.name = decoder.name
        self._prep = GpuPrep(pipeline, decoder, key_of=key_of)

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        return self._prep.images(encoded, device)

    def close(self) -> None:
        """Nothing held beyond memory."""


def dali_importable() -> bool:
    """Whether NVIDIA DALI is installed (``pip install 'unstall[dali]'``), without importing it."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def available_decoder() -> str | None:
    """The GPU decoder GPU prep would use here, by name, or None if none is importable.

    Checks imports only (DALI, then nvImageCodec, then torchvision's nvJPEG); whether a
    CUDA device is present is the caller's question (``torch.cuda.is_available()``).
    """
    if dali_importable():
        import nvidia.dali  # type: ignore[import-not-found]

        return f"DALI {nvidia.dali.__version__} (mixed: hardware JPEG decoder, else nvJPEG)"
    for module, name in (("nvidia.nvimgcodec", "nvImageCodec"), ("torchvision.io", "torchvision")):
        try:
            if importlib.util.find_spec(module) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def pick_engine(
    pipeline: Any,
    device: torch.device,
    *,
    key_of: Callable[[int], str],
    batch_size: int,
    why_not: list[str] | None = None,
) -> Engine:
    """The engine for ``device``: DALI if importable, else a batch decoder + `crop_flip_normalize`.

    On a CPU device (CI, tests) DALI runs its CPU backend and the torch engine decodes
    with unstall's CPU decoder. ``UNSTALL_PREP_ENGINE=dali|torch`` forces one. Each engine
    that cannot be used appends ``"name: reason"`` to ``why_not``.
    """
    why_not = [] if why_not is None else why_not
    forced = os.environ.get(ENGINE_ENV, "").strip().lower() or None
    if forced is not None and forced not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={forced!r} must be one of {ENGINES} or unset")
    if forced in (None, "dali"):
        try:
            from unstall.gpu.dali import DaliEngine

            return DaliEngine(pipeline, device, batch_size=batch_size, key_of=key_of)
        except Exception as exc:  # missing or broken optional library: the next engine
            if forced == "dali":
                raise
            why_not.append(f"DALI: {type(exc).__name__}: {str(exc)[:200]}")
    decoder = pick_decoder(why_not) if device.type == "cuda" else None
    return TorchEngine(pipeline, decoder or cpu_decoder(), key_of=key_of)
