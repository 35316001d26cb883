"""The GPU stage's one interface: an encoded batch in, normalized float images out.

An engine takes the packed encoded part of a batch (`unstall.gpu.prep` layout:
bytes, offsets, crop boxes, flips, indices) and returns ``N x 3 x H x W`` float32
images on the device, decoded, cropped, flipped, resized and normalized as a
batch. Two engines: `DaliEngine` (NVIDIA DALI: native threads without the GIL,
its own CUDA streams in this process's context, the hardware JPEG decoder where
the GPU has one; its CPU backend without a GPU) and `TorchEngine` (a batch
decoder, nvImageCodec, torchvision's nvJPEG or unstall's CPU decoder, then
`crop_flip_normalize`). `pick_engine` chooses and chains them in a
`FallbackEngine` (DALI, then the torch engine, then the CPU workers), so an engine
that fails to build or run is replaced once, with one log line; `available_decoder`
names the best one for the loader's ``prep="auto"`` and for `unstall analyze`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

import torch

from unstall import machine
from unstall.errors import SampleError
from unstall.gpu.augment import box_inside, crop_flip_normalize
from unstall.gpu.dali_feed import FEEDS
from unstall.gpu.decode import GpuDecoder, cpu_decoder, fastest_decoder
from unstall.gpu.fallback import CpuEngine, EngineError, FallbackEngine
from unstall.gpu.installed import dali_importable, installed_decoder
from unstall.gpu.prep import ENCODED
from unstall.pipeline.decode import decode_jpeg

#: Environment variable naming the engine to use (``dali`` or ``torch``); unset: best available.
ENGINE_ENV = machine.PREP_ENGINE_ENV
ENGINES = ("dali", "torch")
#: Environment variable naming how DALI is fed (`unstall.gpu.dali_feed.FEEDS`; unset: tensors).
FEED_ENV = machine.DALI_FEED_ENV


class Engine(Protocol):
    """Prepares the encoded part of a batch on ``device`` (see module doc)."""

    name: str

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor: ...

    def close(self) -> None: ...


class TorchEngine:
    """A batch JPEG decoder, then one batched crop/flip/resize/normalize.

    Images the decoder rejects (or returns in a size that does not hold the crop box)
    are decoded on the CPU; if that fails too, a `SampleError` names the index and key.
    A failure of the engine itself (e.g. a CUDA error) raises `EngineError`.
    """

    def __init__(self, pipeline: Any, decoder: GpuDecoder, *, key_of: Callable[[int], str]):
        self.name = decoder.name
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.decoder = decoder
        self.key_of = key_of

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        try:
            return self.images(encoded, device)
        except SampleError:
            raise
        except RuntimeError as exc:  # CUDA and library errors: the engine's, not a sample's
            raise EngineError(f"{self.name} failed to run") from exc

    def images(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """The batch's images, normalized float32 on ``device``."""
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
            images, encoded["boxes"], encoded["flips"], self.size, mean=self.mean, std=self.std
        )

    def close(self) -> None:
        """Nothing held beyond memory."""

    def _on_cpu(self, jpeg: torch.Tensor, index: int, device: torch.device) -> torch.Tensor:
        try:
            image = decode_jpeg(jpeg.numpy().tobytes())
        except ValueError as exc:
            key = self.key_of(index)
            raise SampleError(
                f"cannot decode sample {index} (key {key!r}) with {self.decoder.name} "
                f"or on the CPU: {exc}",
                index=index,
                key=key,
            ) from exc
        return torch.from_numpy(image).permute(2, 0, 1).to(device)


def _holds(image: torch.Tensor | None, box: list[int]) -> bool:
    """Whether a decoded image holds its crop box (a decoder that rotated it would not)."""
    return image is not None and box_inside(box, image.shape[-2], image.shape[-1])


def available_decoder(*, device: torch.device | None = None) -> str | None:
    """The GPU decoder GPU prep would use here, by name, or None if none is usable.

    DALI if importable. Otherwise, on a CUDA ``device`` (default: the current CUDA
    device where CUDA is available): the batch decoder measured fastest there
    (`fastest_decoder`), or None when none works or none beats one CPU core (then
    prepare on the CPU workers; `decoder_choice` says why). Without CUDA: the first
    importable of nvImageCodec and torchvision, by imports only.
    """
    if not dali_importable():
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        if device is not None and device.type == "cuda":
            decoder, _ = fastest_decoder(device)
            return None if decoder is None else decoder.name
    return installed_decoder()


def decoder_choice(device: torch.device) -> str:
    """Why `available_decoder` chose what it did on ``device``, for the loader's log line
    (e.g. ``"no GPU decoder beats one CPU core (nvImageCodec 900 img/s, ...)"``)."""
    if dali_importable():
        return "DALI is installed"
    if device.type != "cuda":
        return "no CUDA device: unstall's CPU decoder"
    return fastest_decoder(device)[1]


def pick_engine(
    pipeline: Any,
    device: torch.device,
    *,
    key_of: Callable[[int], str],
    batch_size: int,
    why_not: list[str] | None = None,
) -> Engine:
    """The engine for ``device``, in a `FallbackEngine`: DALI if importable, else the torch engine.

    On CUDA the torch engine decodes with the batch decoder measured fastest
    (`fastest_decoder`; unstall's CPU decoder when none works); on a CPU device (CI,
    tests) DALI runs its CPU backend and the torch engine decodes with unstall's CPU
    decoder. Should the engine fail to build or run, the torch engine, then the CPU
    workers take over. ``UNSTALL_PREP_ENGINE=dali|torch`` forces the first engine;
    ``UNSTALL_DALI_FEED=arrays`` feeds DALI the way it documents (one numpy array per
    sample: the baseline ``unstall bench gpufeed`` measures).
    Each engine that cannot be used appends ``"name: reason"`` to ``why_not``.
    """
    why_not = [] if why_not is None else why_not
    forced = machine.prep_engine()
    if forced is not None and forced not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={forced!r} must be one of {ENGINES} or unset")
    feed = machine.dali_feed() or "tensors"
    if feed not in FEEDS:
        raise ValueError(f"{FEED_ENV}={feed!r} must be one of {FEEDS} or unset")

    def torch_engine(*, after_failure: bool = False) -> TorchEngine:
        decoder = None
        if device.type == "cuda":
            decoder, why = fastest_decoder(device)
            if decoder is None and after_failure:  # the CPU workers do better than this thread
                raise RuntimeError(why)
            if decoder is None:
                why_not.append(why)
        return TorchEngine(pipeline, decoder or cpu_decoder(), key_of=key_of)

    last = CpuEngine(pipeline, key_of)
    if forced in (None, "dali"):
        try:
            from unstall.gpu.dali import DaliEngine

            dali = DaliEngine(pipeline, device, batch_size=batch_size, key_of=key_of, feed=feed)
            rest = [("torch engine", lambda: torch_engine(after_failure=True))]
            return FallbackEngine(dali, rest, last)
        except Exception as exc:  # missing or broken optional library: the next engine
            if forced == "dali":
                raise
            why_not.append(f"DALI: {type(exc).__name__}: {str(exc)[:200]}")
    return FallbackEngine(torch_engine(), [], last)
