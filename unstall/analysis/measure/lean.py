"""The job's own images, and the lean pipeline timed beside its ``dataset[i]`` on them.

Measured in the job's process: by a script's agent (cold run), or after the built-in
workload's runs (``unstall analyze --data``); the recommend stage prices the ``lean`` remedy
from the two figures (`unstall.analysis.recommend.remedies`).
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


def job_samples(dataset: Any) -> list[tuple[str, int]]:
    """``(path, index)`` of a few of the dataset's JPEG files, from the list the dataset keeps:
    ``samples``/``imgs`` pairs (torchvision's ImageFolder) or the keys of unstall's own
    `FileDataset` over local files (its ``ImageFolder``: the folder is not walked again). The
    analyzer prices unstall's lean pipeline on them; ``[]`` where the dataset lists none."""
    pairs = getattr(dataset, "samples", None) or getattr(dataset, "imgs", None)
    if isinstance(pairs, (list, tuple)):
        count, name = len(pairs), lambda i: _path_of(pairs[i])
    else:
        keys, path = (
            getattr(dataset, "keys", None),
            getattr(getattr(dataset, "store", None), "path", None),
        )
        if keys is None or not callable(path) or not callable(getattr(dataset, "fetch", None)):
            return []
        count, name = len(keys), lambda i: os.fspath(path(keys[i]))
    out: list[tuple[str, int]] = []
    for i in range(0, count, max(1, count // 48))[:48]:
        found = name(i)
        if found is not None and found.lower().endswith((".jpg", ".jpeg")):
            out.append((found, i))
    return out


def _path_of(item: Any) -> str | None:
    path = item[0] if isinstance(item, (list, tuple)) and item else item
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else None


def lean_probe(dataset: Any, samples: list[tuple[str, int]]) -> dict[str, Any] | None:
    """CPU seconds per sample of the job's own ``dataset[i]`` and of unstall's lean pipeline
    on the same JPEGs (``samples``: `job_samples`), timed side by side in this process (same
    machine, same moment): their ratio prices the lean remedy."""
    chosen = [(f, i) for f, i in samples if os.path.isfile(f)][:16]
    if len(chosen) < 4:
        return None
    import torch

    indices = [i for _, i in chosen]
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
    out["adapt"] = why if adapted is not None and why else None  # the recognized dataset
    out["adapt_refused"] = None if adapted is not None else (why or None)
    return out


def _adapted(dataset: Any) -> tuple[Any, str]:
    """``(the transform prep="lean" runs for this torchvision dataset, its name)``, or
    ``(None, why it is left as it is)`` (`unstall.adapt`): what the lean remedy is timed on.
    unstall's own dataset (``fetch``): ``(its ImagePipeline's uint8 twin, "")``, or
    ``(None, "")`` (the default `ImagePipeline(output="uint8")`) for another transform."""
    import torch

    from unstall.adapt import recognize
    from unstall.adapt.folder import build_transform
    from unstall.pipeline import ImagePipeline

    if callable(getattr(dataset, "fetch", None)):  # unstall's own: the same ops, in uint8
        own = getattr(dataset, "transform", None)
        if isinstance(own, ImagePipeline):
            keep = {k: getattr(own, k) for k in ("scale", "ratio", "flip_p", "mean", "std")}
            return ImagePipeline(own.size, output="uint8", seed=0, **keep), ""
        return None, ""
    found = recognize(dataset)
    if not hasattr(found, "ops"):
        return None, found.reason
    on_device = torch.cuda.is_available() and found.to_float
    return build_transform(found, output="uint8" if on_device else "float"), found.name
