"""JPEG decode on the GPU for a whole batch, with a CPU fallback per rejected image.

Backends, first importable wins (all optional: ``pip install 'unstall[gpu]'``):
nvImageCodec (the hardware JPEG engines where the GPU has them, e.g. H100: ~11,900
img/s without using the SMs; else nvJPEG hybrid), then torchvision's
``decode_jpeg(device="cuda")`` (nvJPEG, ~15,000 img/s decode only on an H100,
deprecated upstream). Figures are from DESIGN.md section 8; not measured here.
Images a backend rejects (CMYK, some progressive or corrupt files) come back as
None and are decoded on the CPU by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

#: ``decode(jpegs, device, stream)`` -> one ``3 x H x W`` uint8 tensor per image, or None.
DecodeFn = Callable[[Sequence[torch.Tensor], torch.device, object], list[torch.Tensor | None]]


@dataclass(frozen=True)
class GpuDecoder:
    """A named batch decoder (``name`` is logged once when GPU prep starts)."""

    name: str
    decode: DecodeFn


def pick_decoder() -> GpuDecoder | None:
    """The best importable GPU JPEG decoder, or None (then prep falls back to the CPU)."""
    for make in (_nvimgcodec, _torchvision):
        try:
            decoder = make()
        except Exception:  # missing or broken optional library: try the next
            continue
        if decoder is not None:
            return decoder
    return None


def cpu_decoder() -> GpuDecoder:
    """Decode on the CPU (simplejpeg/PIL), then move to the device: the fallback and CI path."""
    from unstall.pipeline import decode_jpeg

    def decode(
        jpegs: Sequence[torch.Tensor], device: torch.device, stream: object
    ) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for data in jpegs:
            try:
                image = decode_jpeg(data.numpy().tobytes())
            except ValueError:
                out.append(None)
                continue
            out.append(torch.from_numpy(image).permute(2, 0, 1).to(device))
        return out

    return GpuDecoder("cpu (simplejpeg)", decode)


def _nvimgcodec() -> GpuDecoder | None:
    from nvidia import nvimgcodec  # type: ignore[import-not-found]

    decoder = nvimgcodec.Decoder()
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.RGB)
    source = getattr(nvimgcodec, "DecodeSource", None)

    def decode(
        jpegs: Sequence[torch.Tensor], device: torch.device, stream: object
    ) -> list[torch.Tensor | None]:
        handle = getattr(stream, "cuda_stream", 0)
        arrays = [j.numpy() for j in jpegs]
        if source is not None:  # nvImageCodec >= 0.5 takes DecodeSource objects
            arrays = [source(a) for a in arrays]
        images = decoder.decode(arrays, params=params, cuda_stream=handle)
        return [
            None if im is None else torch.as_tensor(im, device=device).permute(2, 0, 1)
            for im in images
        ]

    return GpuDecoder("nvImageCodec", decode)


def _torchvision() -> GpuDecoder | None:
    from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-not-found]

    def decode(
        jpegs: Sequence[torch.Tensor], device: torch.device, stream: object
    ) -> list[torch.Tensor | None]:
        try:
            return list(decode_jpeg(list(jpegs), mode=ImageReadMode.RGB, device=device))
        except RuntimeError:  # one bad image fails the batch: find it image by image
            out: list[torch.Tensor | None] = []
            for j in jpegs:
                try:
                    out.append(decode_jpeg(j, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    out.append(None)
            return out

    return GpuDecoder("torchvision nvJPEG", decode)
