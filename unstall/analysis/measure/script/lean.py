"""The job's own images, and the lean pipeline timed beside its ``dataset[i]`` on them.

Measured in the job's process by the agent (cold run); the recommend stage prices the
``lean`` remedy from the two figures (`unstall.analysis.recommend.remedies`).
"""

from __future__ import annotations

import os
import time
from typing import Any

#: Images timed for the lean pipeline (enough for a stable mean, a fraction of a second).
LEAN_SAMPLES = 24


def lean_pipeline_cpu(files: list[str], pipeline: Any = None) -> float | None:
    """CPU seconds per sample of ``pipeline`` (default `ImagePipeline(output="uint8")`) on
    these JPEGs (read included)."""
    from unstall.pipeline import ImagePipeline

    paths = [f for f in files if os.path.isfile(f)][:LEAN_SAMPLES]
    if not paths:
        return None
    pipeline = pipeline if pipeline is not None else ImagePipeline(output="uint8", seed=0)
    with open(paths[0], "rb") as f:
        pipeline(f.read())  # warm: imports, first-call set-up
    done = 0
    c0 = time.thread_time()
    for path in paths:
        try:
            with open(path, "rb") as f:
                pipeline(f.read())
            done += 1
        except Exception:  # an image it cannot read is not timed
            continue
    cpu = time.thread_time() - c0
    return cpu / done if done else None


def job_files(dataset: Any) -> list[str]:
    """A few of the dataset's image files, when it lists them (``samples``/``imgs`` pairs, as
    torchvision's ImageFolder does): the analyzer prices unstall's lean pipeline on them."""
    pairs = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    out: list[str] = []
    if isinstance(pairs, (list, tuple)):
        step = max(1, len(pairs) // 48)
        for item in pairs[::step][:48]:
            path = item[0] if isinstance(item, (list, tuple)) and item else item
            if isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(
                (".jpg", ".jpeg")
            ):
                out.append(os.fspath(path))
    return out


def lean_probe(dataset: Any, files: list[str]) -> dict[str, Any] | None:
    """CPU seconds per sample of the job's own ``dataset[i]`` and of unstall's lean pipeline
    on the same JPEGs, timed side by side in this process (same machine, same moment): their
    ratio prices the lean remedy."""
    if not files:
        return None
    import torch

    listed = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None) or []
    paths = {os.fspath(item[0]): i for i, item in enumerate(listed)}
    chosen = [(f, paths[f]) for f in files if f in paths][:16]
    indices = [i for _, i in chosen]
    if len(indices) < 4:
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker
    try:
        dataset[indices[0]]  # warm: imports, plugin lookups
        c0 = time.thread_time()
        for i in indices:
            dataset[i]
        own = (time.thread_time() - c0) / len(indices)
        adapted, why = _adapted(dataset)
        lean = lean_pipeline_cpu([f for f, _ in chosen], adapted)
    except Exception:  # the probe is optional: no figure then
        return None
    finally:
        torch.set_num_threads(threads)
    if lean is None or own <= 0:
        return None
    out: dict[str, Any] = {"own_cpu_s": own, "lean_cpu_s": lean, "samples": len(indices)}
    out["adapt"] = why if adapted is not None else None  # the recognized dataset, by name
    out["adapt_refused"] = None if adapted is not None else why
    return out


def _adapted(dataset: Any) -> tuple[Any, str]:
    """``(the transform prep="lean" runs for this torchvision dataset, its name)``, or
    ``(None, why it is left as it is)`` (`unstall.adapt`): what the lean remedy is timed on."""
    import torch

    from unstall.adapt import recognize
    from unstall.adapt.folder import build_transform

    found = recognize(dataset)
    if not hasattr(found, "ops"):
        return None, found.reason
    on_device = torch.cuda.is_available() and found.to_float
    return build_transform(found, output="uint8" if on_device else "float"), found.name
