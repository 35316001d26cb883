"""The loader's device path: which preparation runs where, and the one-ahead device loop.

`plan_prep` decides ``prep`` (CPU workers, a GPU stage, or both on every batch)
once, at construction; `iterate_on_device` is the iteration used when the loader has a
``device``: host batches come from torch's workers (slots when zero-copy), go
to a `DeviceStage` one batch ahead, and are handed out ready on the device.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data

from unstall.loader.device import DeviceStage
from unstall.loader.failures import raise_if_failed
from unstall.loader.handoff import unpack
from unstall.loader.slot_handoff import SlotHandoff
from unstall.loader.stats import LoaderStats

log = logging.getLogger("unstall")

PREPS = ("auto", "cpu", "gpu", "hybrid")


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
    if prep not in (None, *PREPS):
        raise ValueError(f"prep={prep!r} must be one of {PREPS} or None (choose by device)")
    pipeline = standard_pipeline(dataset)
    on_gpu = device is not None and device.type == "cuda"
    if prep in (None, "auto"):
        from unstall.gpu.engine import available_decoder

        standard = pipeline is not None and collate_fn is torch.utils.data.default_collate
        usable = standard and batch_size is not None and device is not None
        if not usable or (prep is None and not on_gpu):
            return "cpu", dataset, collate_fn, None
        if on_gpu and available_decoder() is None:
            log.info(
                "prep='auto': no GPU JPEG decoder importable (pip install 'unstall[dali]'): "
                "preparing on the CPU workers"
            )
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
    return split_prep_parts(dataset, pipeline, device, prep, batch_size, num_workers)


def split_prep_parts(
    dataset: Any, pipeline: Any, device: torch.device, prep: str, batch_size: int, workers: int
) -> tuple[str, Any, Any, Any]:
    """`plan_prep`'s answer for a GPU stage: the workers' `SplitView`, its collate, `HybridPrep`."""
    from unstall.gpu.controller import ShareController
    from unstall.gpu.engine import pick_engine
    from unstall.gpu.hybrid import HybridPrep
    from unstall.gpu.split import SplitView, shared_rows

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
    return prep, view, view.collate, HybridPrep(pipeline, engine, controller, rows)


def gpu_prep_parts(dataset: Any, pipeline: Any, decoder: Any) -> tuple[str, Any, Any, Any]:
    """GPU prep with ``decoder`` and no CPU share, without the split (tests pass a CPU decoder)."""
    from unstall.gpu.prep import EncodedView, GpuPrep, collate_encoded

    prep_fn = GpuPrep(pipeline, decoder, key_of=dataset.key)
    return "gpu", EncodedView(dataset, pipeline), collate_encoded, prep_fn


def iterate_on_device(
    torch_iter: Iterator[Any],
    position: list[int],
    stats: LoaderStats,
    stage: DeviceStage,
    *,
    handoff: SlotHandoff | None,
    unpack_inline: bool,
    main_cpu: list[Any],
) -> Iterator[Any]:
    """Yield device batches, keeping one submitted ahead of the one handed out.

    Slots are freed at each request once nothing (the stage included) references
    their host batches. The caller (`iterate.SizedIterator`) times the waits,
    counts the samples and ends the epoch.
    """
    if handoff is not None and handoff.size == 0:
        handoff = None  # batches too small for slots: inline unpacking only
    pending: Any = None
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        while True:
            handle = None
            try:
                batch, timing = next(torch_iter)
            except StopIteration:
                batch = None
            raise_if_failed(batch, handoff)
            if handoff is not None:
                handoff.reclaim()
            if batch is not None:
                if handoff is not None:
                    batch = handoff.receive(batch)
                elif unpack_inline:
                    batch = unpack(batch)
                handle = stage.submit(batch)
                batch = None
                stats.add_task(timing, t0, time.perf_counter() - t0)
            if pending is None and handle is not None:  # first batch: fetch one more first
                pending = handle
                continue
            if pending is None:
                break
            out = stage.finish(pending)
            pending = handle
            position[1] += 1
            main_cpu[0] += time.thread_time() - c0
            main_cpu[1] += 1
            yield out
            t0, c0 = time.perf_counter(), time.thread_time()
            if pending is None:
                break
    except BaseException as exc:
        if handoff is not None and not isinstance(exc, GeneratorExit):
            handoff.retire()
        raise
    finally:
        stage.close()
