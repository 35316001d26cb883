"""`bench train`'s look inside the GPU stage: its engine alone, and its rate in the loader.

The GPU stage's engine (DALI's ``mixed`` decoder on CUDA) is timed alone on the bench's own
JPEGs, the way `unstall analyze` prices the GPU remedy (`unstall.gpu.probe`: crops drawn and
batches packed as the workers would, the engine fed from this thread, nothing else on the
GPU), once from ordinary memory and, on CUDA, once from page-locked memory (where the
loader's zero-copy slots keep a batch's bytes). Beside it, what each GPU-stage variant
delivered in training (``prep="gpu"``: every sample through that engine; hybrid: a share)
and the rate its share controller measured for the stage. Two more timings split the
distance between the engine alone and the loader, no model in either: the stage as the
loader runs it (`unstall.gpu.plugin.stage_parts`' prep behind a `DeviceStage`: its thread,
side stream and two batches in flight) on batches packed in this process (``stage_alone``),
and the loader with ``prep="gpu"`` (its workers and zero-copy slots too: ``loader_alone``).
When the engine alone is several
times what ``prep="gpu"`` delivered, the loss is in the stage around the engine, not in
decoding: what an H200 showed on 2026-11-29 (the engine alone ~30,000 images/s in a scratch
run, ``prep="gpu"`` 2,300-3,900).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from unstall.data import ImageFolder
from unstall.gpu.plugin import stage_parts
from unstall.gpu.probe import gpu_prep_rate
from unstall.loader import DataLoader
from unstall.loader.device import DeviceStage
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

#: Timed batches of the engine alone, after one warm-up batch (its pipeline's build).
BATCHES = 8
#: The stage alone and the loader alone: warm-up batches, timed batches; batches packed.
WARMUP, TIMED, STAGE_BATCHES = 4, 24, 8


def stage_check(
    root: str,
    device: str,
    batch_size: int,
    image_size: int,
    workers: int,
    ran: dict[str, tuple[float, dict[str, Any]]],
) -> dict[str, Any] | None:
    """The engine alone on ``root``'s JPEGs beside each GPU-stage variant that ran (``ran``:
    variant -> its delivered samples/s and its ``prep_plan``), or None where none ran or the
    engine cannot be timed here."""
    if not ran:
        return None
    store = LocalStore(root)
    dataset = ImageFolder(store, transform=ImagePipeline(image_size))
    files = [str(store.path(dataset.key(i))) for i in range(min(batch_size, len(dataset)))]
    dev = torch.device(device)
    shape = {"batch_size": batch_size, "batches": BATCHES, "image_size": image_size}
    alone = gpu_prep_rate(files, device=dev, **shape)
    if alone is None:
        return None
    out: dict[str, Any] = {"engine": alone["engine"], "engine_alone_per_s": alone["gpu_per_s"]}
    if dev.type == "cuda":
        locked = gpu_prep_rate(files, device=dev, page_locked=True, **shape)
        out["engine_alone_page_locked_per_s"] = locked["gpu_per_s"] if locked else None
    for key, timing in (
        ("stage_alone_per_s", lambda: stage_alone(dataset, dev, batch_size)),
        ("loader_alone_per_s", lambda: loader_alone(dataset, dev, batch_size, workers)),
    ):
        try:  # a diagnosis: its failure is said, and never costs the bench its rows
            out[key] = round(timing(), 1)
        except Exception as exc:
            out[key] = None
            out[key.replace("_per_s", "_error")] = f"{type(exc).__name__}: {exc}"[:300]
    out["variants"] = {
        name: {
            "delivered_per_s": round(rate, 1),
            "delivered_over_alone": round(rate / alone["gpu_per_s"], 4),
            "stage_measured_per_s": plan.get("gpu_rate_per_s"),  # its share controller's
        }
        for name, (rate, plan) in ran.items()
    }
    return out


def stage_alone(dataset: Any, device: torch.device, batch_size: int) -> float:
    """Images/s of the GPU stage as the loader runs it (``prep="gpu"``'s parts behind a
    `DeviceStage`, one batch ahead), on batches of ``dataset`` packed here, no workers."""
    parts = stage_parts(dataset, dataset.transform, device, "gpu", batch_size, 1)
    if parts is None:
        return 0.0
    _, view, collate, prep = parts
    packed = [
        collate([view[i] for i in range(k * batch_size, (k + 1) * batch_size)])
        for k in range(min(STAGE_BATCHES, len(dataset) // batch_size))
    ]
    stage = DeviceStage(device, None, prep=prep)
    try:
        ahead = stage.submit(packed[0])
        for i in range(1, WARMUP + 1):  # the engine's build and first batches
            handle = stage.submit(packed[i % len(packed)])
            stage.finish(ahead)
            ahead = handle
        _sync(device)
        start = time.perf_counter()
        for i in range(TIMED):
            handle = stage.submit(packed[i % len(packed)])
            stage.finish(ahead)
            ahead = handle
        _sync(device)
        rate = TIMED * batch_size / (time.perf_counter() - start)
        stage.finish(ahead)
    finally:
        stage.close()
        prep.close()
    return rate


def loader_alone(dataset: Any, device: torch.device, batch_size: int, workers: int) -> float:
    """Images/s the loader with ``prep="gpu"`` hands out over ``dataset``, nothing else running."""
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
        prep="gpu", device=device,
    )  # fmt: skip
    count = len(dataset) // batch_size  # one epoch: no second start of the workers
    warm = min(WARMUP, count // 2)
    timed = min(TIMED, count - warm)
    batches = iter(loader)
    try:
        for _ in range(warm):
            next(batches)
        _sync(device)
        start = time.perf_counter()
        for _ in range(timed):
            next(batches)
        _sync(device)
        return timed * batch_size / (time.perf_counter() - start)
    finally:
        del batches
        loader.close()


def said(check: dict[str, Any]) -> str:
    """One line for the console."""
    text = f"  GPU stage: its engine alone {check['engine_alone_per_s']:,.0f} images/s"
    locked = check.get("engine_alone_page_locked_per_s")
    if locked:
        text += f" ({locked:,.0f}/s from page-locked memory)"
    for key, what in (
        ("stage_alone", "as the loader runs it, batches packed here"),
        ("loader_alone", "the loader, prep='gpu', no model"),
    ):
        rate = check[f"{key}_per_s"]
        text += f"; {what} " + (f"{rate:,.0f}/s" if rate is not None else check[f"{key}_error"])
    for name, v in check["variants"].items():
        text += (
            f"; {name} delivered {v['delivered_per_s']:,.0f}/s"
            f" ({v['delivered_over_alone']:.2f} of it)"
        )
    return text


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
