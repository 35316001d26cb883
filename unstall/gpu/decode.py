"""JPEG decode on the GPU for a whole batch, with a CPU fallback per rejected image.

Backends, first importable wins (all optional: ``pip install 'unstall[gpu]'``):
nvImageCodec (the hardware JPEG engines where the GPU has them, e.g. H100: ~11,900
img/s without using the SMs; else nvJPEG hybrid), then torchvision's
``decode_jpeg(device="cuda")`` (nvJPEG, ~15,000 img/s decode only on an H100,
deprecated upstream). Figures are from DESIGN.md section 8; not measured here.
Images a backend rejects (CMYK, some progressive or corrupt files) come back as
None and are decoded on the CPU by the caller. No backend applies EXIF orientation
(the CPU path never does; crop boxes are drawn on the stored size).

`fastest_decoder` chooses among the importable backends on a CUDA device by
decoding the same small synthetic batch with each (and on one CPU core with
unstall's decoder): the fastest is used, or none when it is not faster than one
CPU core; the rates measured are said in the loader's log line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: ``decode(jpegs, device, stream)`` -> one ``3 x H x W`` uint8 tensor per image, or None.
DecodeFn = Callable[[Sequence[torch.Tensor], torch.device, object], list[torch.Tensor | None]]


@dataclass(frozen=True)
class GpuDecoder:
    """A named batch decoder (``name`` is logged once when GPU prep starts)."""

    name: str
    decode: DecodeFn


def pick_decoder(why_not: list[str] | None = None) -> GpuDecoder | None:
    """The best importable GPU JPEG decoder, or None (then prep falls back to the CPU).

    Each backend that cannot be used appends ``"name: reason"`` to ``why_not``, so
    the one log line of the fallback can say what was missing.
    """
    for name, make in BACKENDS:
        try:
            return make()
        except Exception as exc:  # missing or broken optional library: try the next
            if why_not is not None:
                why_not.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
    return None


_measured: dict[str, tuple[GpuDecoder | None, str]] = {}


def fastest_decoder(device: torch.device, *, images: int = 32) -> tuple[GpuDecoder | None, str]:
    """The importable GPU decoder that decodes a synthetic batch fastest on ``device``, and why.

    Each backend decodes ``images`` copies of one 500 x 375 JPEG (quality 90, the
    demo dataset's kind) once to warm up, then once timed (the device synchronized);
    unstall's CPU decoder decodes them on this thread. None, with the reason, when no
    GPU backend works or the fastest is not faster than one CPU core (then the CPU
    workers prepare everything). Measured once per device per process.
    """
    key = str(device)
    if key not in _measured:
        _measured[key] = _measure(device, images)
    return _measured[key]


def _measure(device: torch.device, images: int) -> tuple[GpuDecoder | None, str]:
    from unstall.data.synthetic import render_image

    jpeg = torch.from_numpy(np.frombuffer(render_image(0, 0, classes=1), np.uint8).copy())
    batch = [jpeg] * images
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    rates: list[tuple[float, GpuDecoder]] = []
    said: list[str] = []
    for name, make in (*BACKENDS, ("cpu", cpu_decoder)):
        try:
            decoder = make()
            decoder.decode(batch[:2], device, stream)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = decoder.decode(batch, device if name != "cpu" else torch.device("cpu"), stream)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if any(im is None for im in out):
                raise ValueError("rejected the test JPEG")
            rate = images / max(time.perf_counter() - t0, 1e-9)
        except Exception as exc:  # missing, broken, or no device: not a candidate
            said.append(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        rates.append((rate, decoder))
        said.append(f"{decoder.name} {rate:,.0f} img/s")
    cpu = next((r for r, d in rates if d.name.startswith("cpu")), 0.0)
    gpu = [(r, d) for r, d in rates if not d.name.startswith("cpu")]
    table = ", ".join(said)
    if not gpu:
        return None, f"no GPU JPEG decoder works here ({table})"
    rate, best = max(gpu, key=lambda x: x[0])
    if rate <= cpu:
        return None, f"no GPU decoder beats one CPU core ({table})"
    return best, f"{best.name}: measured fastest ({table})"


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


def _nvimgcodec(*, cpu_only: bool = False) -> GpuDecoder:
    """nvImageCodec's batch decoder; ``cpu_only`` (tests without a GPU) uses its CPU backend."""
    from nvidia import nvimgcodec  # type: ignore[import-not-found]

    if cpu_only:
        decoder = nvimgcodec.Decoder(
            device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
            backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
        )
    else:
        decoder = nvimgcodec.Decoder()
    params = rgb_params(nvimgcodec)

    def decode(
        jpegs: Sequence[torch.Tensor], device: torch.device, stream: object
    ) -> list[torch.Tensor | None]:
        handle = getattr(stream, "cuda_stream", 0)
        images = decoder.decode([j.numpy() for j in jpegs], params=params, cuda_stream=handle)
        return [None if im is None else _chw(im, device) for im in images]  # None: rejected

    return GpuDecoder("nvImageCodec", decode)


def rgb_params(nvimgcodec: Any) -> Any:
    """Decode parameters for 3-channel interleaved RGB, also from grayscale files, unrotated.

    nvImageCodec >= 0.5 names the colour space ``SRGB`` and the layout ``SampleFormat.I_RGB``
    (without it a grayscale JPEG comes out with one channel); older ones ``ColorSpec.RGB``.
    EXIF orientation is not applied (nvImageCodec's default applies it): the crop box is
    drawn from the header's size, and the CPU path (like torchvision's) never rotates.
    """
    spec = nvimgcodec.ColorSpec
    if hasattr(nvimgcodec, "SampleFormat"):
        return nvimgcodec.DecodeParams(
            apply_exif_orientation=False,
            color_spec=spec.SRGB,
            sample_format=nvimgcodec.SampleFormat.I_RGB,
        )
    return nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=spec.RGB)


def _chw(image: Any, device: torch.device) -> torch.Tensor:
    """An nvImageCodec ``H x W x 3`` image as a ``3 x H x W`` tensor on ``device``, no copy on GPU.

    DLPack hands over the device buffer, synchronized with the current stream.
    """
    if device.type == "cuda":
        return torch.from_dlpack(image).permute(2, 0, 1)
    return torch.from_numpy(np.asarray(image.cpu())).permute(2, 0, 1).to(device)


def _torchvision() -> GpuDecoder:
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


#: GPU backends in order of preference: (name, maker).
BACKENDS: tuple[tuple[str, Callable[[], GpuDecoder]], ...] = (
    ("nvImageCodec", _nvimgcodec),
    ("torchvision", _torchvision),
)
