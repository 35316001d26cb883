"""GPU preparation: a GPU stage that decodes and augments whole batches, beside the CPU workers.

Used by ``unstall.DataLoader(..., device="cuda", prep="auto"|"gpu"|"hybrid")``: workers
fetch bytes and draw each sample's crop and flip (`split`); the GPU stage's engine
(`engine`: DALI, or a batch decoder + `crop_flip_normalize`) prepares its share of every
batch, the workers the rest, the share following both sides' measured rates
(`controller`, `hybrid`, timed with CUDA events). An engine that fails to build or run
is replaced once, with one log line: DALI, then the torch engine, then the CPU workers
(`fallback`). Every engine gives the CPU path's pixels: no EXIF rotation, the same
chroma upsampling and antialiased resize. GPU libraries are optional (``pip install
'unstall[dali]'``, ``'unstall[dali-cu12]'`` or ``'unstall[gpu]'``) and imported only
when used; everything also runs on the CPU. `gpu_prep_rate` measures the stage's own
rate on a job's files, for ``unstall analyze``.
Names load on first use (`installed` names the decoder without torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

_HOMES = {
    "available_decoder": "unstall.gpu.engine",
    "cpu_decoder": "unstall.gpu.decode",
    "crop_flip_normalize": "unstall.gpu.augment",
    "decoder_choice": "unstall.gpu.engine",
    "Engine": "unstall.gpu.engine",
    "EngineError": "unstall.gpu.fallback",
    "FallbackEngine": "unstall.gpu.fallback",
    "gpu_prep_rate": "unstall.gpu.probe",
    "GpuDecoder": "unstall.gpu.decode",
    "pad_batch": "unstall.gpu.augment",
    "pick_decoder": "unstall.gpu.decode",
    "pick_engine": "unstall.gpu.engine",
    "reference_crop_flip_normalize": "unstall.gpu.augment",
    "TorchEngine": "unstall.gpu.engine",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
    from unstall.gpu.augment import crop_flip_normalize, pad_batch, reference_crop_flip_normalize
    from unstall.gpu.decode import GpuDecoder, cpu_decoder, pick_decoder
    from unstall.gpu.engine import (
        Engine,
        TorchEngine,
        available_decoder,
        decoder_choice,
        pick_engine,
    )
    from unstall.gpu.fallback import EngineError, FallbackEngine
    from unstall.gpu.probe import gpu_prep_rate

__all__ = [
    "Engine",
    "EngineError",
    "FallbackEngine",
    "GpuDecoder",
    "TorchEngine",
    "available_decoder",
    "cpu_decoder",
    "crop_flip_normalize",
    "decoder_choice",
    "gpu_prep_rate",
    "pad_batch",
    "pick_decoder",
    "pick_engine",
    "reference_crop_flip_normalize",
]
