"""The GPU stage's own rate on a job's JPEGs: what `unstall analyze` prices the GPU remedy with.

On a machine with CUDA and a GPU decoder, a short run of the engine ``prep="gpu"`` would
use (DALI's ``mixed`` decoder, else the fastest batch decoder) over a few of the job's
own files: crops drawn as the workers would, batches packed as they would, one warm-up
batch (the pipeline's build), then timed batches, the device synchronized at the end.
It runs in the analyzer's process after the job has finished, so it shares the GPU
with nothing. Without CUDA, files or a usable engine it measures nothing (None).
``page_locked`` puts each batch's bytes in page-locked memory first, as the loader's
zero-copy slots hold them on a CUDA device (they are registered with CUDA), so `bench
train` can tell the engine's rate on such memory from its rate on ordinary memory.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

#: Samples per probe batch and timed batches (a second or two on a GPU).
PROBE_BATCH, PROBE_BATCHES = 64, 4


def gpu_prep_rate(
    files: list[str],
    *,
    device: torch.device | None = None,
    batch_size: int = PROBE_BATCH,
    batches: int = PROBE_BATCHES,
    page_locked: bool = False,
    image_size: int = 224,
) -> dict[str, Any] | None:
    """``{"gpu_per_s", "engine", "samples", "batch_size"}`` of the GPU stage on ``files``
    (cycled to fill the batches), or None where it cannot be measured here. ``page_locked``:
    the bytes in page-locked memory (CUDA only), as the loader's slots hold them;
    ``image_size``: the crops' side [Unit: pixel]."""
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    raws = []
    for path in files:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                raws.append(f.read())
    if not raws:
        return None
    from unstall.gpu.engine import pick_engine
    from unstall.gpu.prep import ENCODED, EncodedImage, _encode, draw
    from unstall.gpu.split import engine_accepts
    from unstall.pipeline import ImagePipeline

    raws = [r for r in raws if engine_accepts(r)]
    if not raws:
        return None
    pipeline = ImagePipeline(image_size, seed=0)
    engine = pick_engine(pipeline, device, key_of=str, batch_size=batch_size)
    try:
        packed = []
        for b in range(batches + 1):
            picked = [raws[(b * batch_size + i) % len(raws)] for i in range(batch_size)]
            batch = _encode([EncodedImage(r, *draw(pipeline, r), i) for i, r in enumerate(picked)])
            if page_locked and device.type == "cuda":
                batch[ENCODED] = batch[ENCODED].pin_memory()
            packed.append(batch)
        engine(packed[0], device)  # the build, the first batch's set-up
        _sync(device)
        start = time.perf_counter()
        for batch in packed[1:]:
            engine(batch, device)
        _sync(device)
        wall = time.perf_counter() - start
    except Exception:  # an engine that cannot run here prices nothing
        return None
    finally:
        engine.close()
    if getattr(engine, "cpu_only", False):  # every GPU engine failed: not the GPU's rate
        return None
    return {
        "gpu_per_s": round(batches * batch_size / wall, 1),
        "engine": engine.name,
        "samples": batches * batch_size,
        "batch_size": batch_size,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
