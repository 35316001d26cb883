"""`bench train`'s look inside the GPU stage: its engine alone, and its rate in the loader.

The GPU stage's engine (DALI's ``mixed`` decoder on CUDA) is timed alone on the bench's own
JPEGs, the way `unstall analyze` prices the GPU remedy (`unstall.gpu.probe`: crops drawn and
batches packed as the workers would, the engine fed from this thread, nothing else on the
GPU), once from ordinary memory and, on CUDA, once from page-locked memory (where the
loader's zero-copy slots keep a batch's bytes). Beside it, what each GPU-stage variant
delivered in training (``prep="gpu"``: every sample through that engine; hybrid: a share)
and the rate its share controller measured for the stage. When the engine alone is several
times what ``prep="gpu"`` delivered, the loss is in the stage around the engine, not in
decoding: what an H200 showed on 2026-11-29 (the engine alone ~30,000 images/s in a scratch
run, ``prep="gpu"`` 2,300-3,900).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from unstall.gpu.probe import gpu_prep_rate

#: Timed batches of the engine alone, after one warm-up batch (its pipeline's build).
BATCHES = 8


def stage_check(
    root: str,
    device: str,
    batch_size: int,
    image_size: int,
    ran: dict[str, tuple[float, dict[str, Any]]],
) -> dict[str, Any] | None:
    """The engine alone on ``root``'s JPEGs beside each GPU-stage variant that ran (``ran``:
    variant -> its delivered samples/s and its ``prep_plan``), or None where none ran or the
    engine cannot be timed here."""
    if not ran:
        return None
    files = _files(root, batch_size)
    dev = torch.device(device)
    shape = {"batch_size": batch_size, "batches": BATCHES, "image_size": image_size}
    alone = gpu_prep_rate(files, device=dev, **shape)
    if alone is None:
        return None
    out: dict[str, Any] = {"engine": alone["engine"], "engine_alone_per_s": alone["gpu_per_s"]}
    if dev.type == "cuda":
        locked = gpu_prep_rate(files, device=dev, page_locked=True, **shape)
        out["engine_alone_page_locked_per_s"] = locked["gpu_per_s"] if locked else None
    out["variants"] = {
        name: {
            "delivered_per_s": round(rate, 1),
            "delivered_over_alone": round(rate / alone["gpu_per_s"], 4),
            "stage_measured_per_s": plan.get("gpu_rate_per_s"),  # its share controller's
        }
        for name, (rate, plan) in ran.items()
    }
    return out


def said(check: dict[str, Any]) -> str:
    """One line for the console."""
    text = f"  GPU stage: its engine alone {check['engine_alone_per_s']:,.0f} images/s"
    locked = check.get("engine_alone_page_locked_per_s")
    if locked:
        text += f" ({locked:,.0f}/s from page-locked memory)"
    for name, v in check["variants"].items():
        text += (
            f"; {name} delivered {v['delivered_per_s']:,.0f}/s"
            f" ({v['delivered_over_alone']:.2f} of it)"
        )
    return text


def _files(root: str, count: int) -> list[str]:
    """Up to ``count`` JPEGs of the class folders under ``root``, in name order."""
    found: list[str] = []
    for folder in sorted(os.scandir(root), key=lambda e: e.name):
        if folder.is_dir():
            names = sorted(n for n in os.listdir(folder.path) if n.endswith(".jpg"))
            found += [os.path.join(folder.path, n) for n in names]
        if len(found) >= count:
            break
    return found[:count]
