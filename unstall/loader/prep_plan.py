"""Which preparation runs where: CPU workers, a GPU stage, or both on every batch.

`plan_prep` decides ``prep`` once, at construction. The GPU stage is a loader extension
(`extensions`, ``"prep"``, served by `unstall.gpu.plugin`): the loader never imports
the GPU package itself, only asks the extension for the stage's parts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data

from unstall.loader import extensions


def standard_pipeline(dataset: Any) -> Any:
    """The dataset's `ImagePipeline` if it uses the standard one (so GPU prep can replace it)."""
    transforms = sys.modules.get("unstall.pipeline.transforms")
    if transforms is None:  # no ImagePipeline was ever made: nothing to load for it
        return None
    ImagePipeline = transforms.ImagePipeline
    transform = getattr(dataset, "transform", None)
    if type(transform) is ImagePipeline and callable(getattr(dataset, "fetch", None)):
        return transform
    return None


def default_device_transform(dataset: Any, prep: str) -> Any:
    """`NormalizeImages` with the pipeline's mean/std for ``ImagePipeline(output="uint8")`` data."""
    pipeline = standard_pipeline(dataset)
    if prep != "cpu" or pipeline is None or pipeline.output != "uint8":
        return None
    from unstall.loader.device import NormalizeImages

    return NormalizeImages(pipeline.mean, pipeline.std)


def declared_batch_bytes(dataset: Any, batch_size: int | None, prep: str) -> int | None:
    """Bytes of a batch's images when the standard pipeline declares them (sizes slots up front)."""
    pipeline = standard_pipeline(dataset)
    if pipeline is None or prep != "cpu" or batch_size is None:
        return None
    height, width = pipeline.size
    return batch_size * 3 * height * width * (1 if pipeline.output == "uint8" else 4)


def plan_prep(
    prep: str | None,
    dataset: Any,
    device: torch.device | None,
    collate_fn: Callable[[list[Any]], Any],
    *,
    batch_size: int | None = None,
    num_workers: int = 0,
) -> tuple[str, Any, Callable[[list[Any]], Any], Any]:
    """``(prep, dataset for the workers, collate_fn, device-side prep or None)``.

    ``"cpu"``: workers prepare everything. ``"gpu"``/``"hybrid"``/``"auto"``: workers
    fetch bytes and draw crops, a GPU stage (`unstall.gpu.engine`) decodes and augments
    its share of each batch, the workers prepare the rest lean (`unstall.gpu.split`):
    none, a share that follows the measured rates, or whatever ``auto`` settles on.
    ``None`` is ``"auto"`` on a CUDA device with the standard pipeline and a GPU decoder
    importable, else ``"cpu"``; the choice is logged in one line. On ``device="cpu"``
    (CI) an explicit ``"auto"``/``"gpu"``/``"hybrid"`` runs the same stage with a CPU
    engine; ``"auto"`` without a device or the standard pipeline is ``"cpu"``.
    """
    pipeline = standard_pipeline(dataset)
    on_gpu = device is not None and device.type == "cuda"
    if prep in (None, "auto"):
        standard = pipeline is not None and collate_fn is torch.utils.data.default_collate
        usable = standard and batch_size is not None and device is not None
        if not usable or (prep is None and not on_gpu):
            return "cpu", dataset, collate_fn, None
        prep = "auto"
    if prep == "cpu":
        return "cpu", dataset, collate_fn, None
    if pipeline is None:
        raise ValueError(
            f"prep={prep!r} replaces the standard unstall.ImagePipeline, but dataset "
            f"{type(dataset).__name__} has transform={getattr(dataset, 'transform', None)!r}; "
            "use an ImageFolder/FileDataset with ImagePipeline, or prep='cpu'"
        )
    if collate_fn is not torch.utils.data.default_collate:
        raise ValueError(
            f"prep={prep!r} collates encoded images itself, so collate_fn={collate_fn!r} "
            "cannot be used with it; drop collate_fn or use prep='cpu'"
        )
    if device is None:
        raise ValueError(f"prep={prep!r} prepares on a device; pass device='cuda' (or 'cpu')")
    if batch_size is None:
        raise ValueError(f"prep={prep!r} prepares whole batches; pass batch_size (not None)")
    # the GPU stage's parts: None when "auto" finds no GPU decoder for a CUDA device
    parts = extensions.get("prep")(dataset, pipeline, device, prep, batch_size, num_workers)
    return parts if parts is not None else ("cpu", dataset, collate_fn, None)
