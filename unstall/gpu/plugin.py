"""The GPU stage as a loader extension: what ``prep="gpu"|"hybrid"|"auto"`` runs.

The loader plans ``prep`` (`unstall.loader.prep_plan`) without importing this package:
it asks the ``"prep"`` extension (`unstall.loader.extensions`) for the stage's parts,
and the registry imports this module, which registers `stage_parts`, on first use.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from unstall import machine
from unstall.gpu.controller import ShareController
from unstall.gpu.engine import available_decoder, decoder_choice, pick_engine
from unstall.gpu.hybrid import HybridPrep
from unstall.gpu.split import SplitView, shared_rows
from unstall.gpu.tune import DecoderTuner, Setting
from unstall.loader import extensions

log = logging.getLogger("unstall")


def stage_parts(
    dataset: Any, pipeline: Any, device: torch.device, prep: str, batch_size: int, workers: int
) -> tuple[str, Any, Any, Any] | None:
    """``(prep, the workers' dataset, its collate_fn, the device-side prep)`` for a GPU stage.

    The workers load a `SplitView` (bytes plus crops, a lean CPU share), the training
    process runs `HybridPrep` (the engine for the encoded rows), and a `ShareController`
    moves the CPU share with both sides' measured rates; on a GPU, a `DecoderTuner` picks
    DALI's hardware-decoder share and threads by measurement. None for ``"auto"`` on a CUDA
    device where no GPU decoder is usable or none beats a CPU core (measured): the loader
    then prepares on the CPU.
    """
    if prep == "auto" and device.type == "cuda" and available_decoder(device=device) is None:
        log.info(
            "prep='auto': preparing on the CPU workers: %s (pip install 'unstall[dali]' "
            "for DALI's decoder)",
            decoder_choice(device),
        )
        return None
    why_not: list[str] = []
    engine = pick_engine(
        pipeline, device, key_of=dataset.key, batch_size=batch_size, why_not=why_not
    )
    controller = ShareController(batch_size, workers, prep)
    rows = shared_rows(controller.cpu_rows)
    view = SplitView(dataset, pipeline, rows)
    log.info(
        "prep=%r: decoding with %s on %s%s",
        prep,
        engine.name,
        device,
        f" (not used: {'; '.join(why_not)})" if why_not else "",
    )
    tuner = decoder_tuner(engine, device)
    return prep, view, view.collate, HybridPrep(pipeline, engine, controller, rows, tuner)


def decoder_tuner(engine: Any, device: torch.device) -> DecoderTuner | None:
    """A tuner of DALI's decoder share and threads where DALI's ``mixed`` decoder runs (a
    CUDA device); None elsewhere (the CPU backend has no hardware decoder to share with)."""
    settings = engine.settings() if hasattr(engine, "settings") else {}
    if device.type != "cuda" or settings.get("dali_hw_decoder_load") is None:
        return None
    start = Setting(settings["dali_hw_decoder_load"], settings["dali_threads"])
    most = max(start.threads, machine.cores_available() // 2)  # the CPU workers need the rest
    return DecoderTuner(start, max_threads=most)


extensions.register("prep", stage_parts)
