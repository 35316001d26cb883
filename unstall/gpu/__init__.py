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

from unstall.lazy import homes_of, lazy_exports

_HOMES = homes_of(
    {
        "unstall.gpu.augment": "crop_flip_normalize pad_batch reference_crop_flip_normalize",
        "unstall.gpu.decode": "cpu_decoder GpuDecoder pick_decoder",
        "unstall.gpu.engine": "available_decoder decoder_choice Engine pick_engine TorchEngine",
        "unstall.gpu.fallback": "EngineError FallbackEngine",
        "unstall.gpu.probe": "gpu_prep_rate",
    }
)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = sorted(_HOMES)
