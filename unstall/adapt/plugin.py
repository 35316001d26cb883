"""``prep="lean"|"gpu"|"hybrid"|"auto"`` for a torchvision dataset: what the loader runs instead.

Registered as the loader's ``"adapt"`` extension (`unstall.loader.extensions`): the loader
asks it, before building anything, to replace a dataset it does not know (no ``fetch``)
when one of those ``prep`` values is given (by the script, or by ``unstall run --config``).
A recognized torchvision pipeline becomes unstall's (`unstall.adapt.folder`); the batch the
loop receives keeps the script's dtype, shape and value range (float32, normalized):
lean work (uint8 decode, crop, resize, flip) on the CPU workers, normalized in the workers
without a GPU, or on the GPU after a 4x smaller copy, where the batch then already is (so
the loop's ``.cuda()`` / ``.to(device)`` costs nothing). An unknown dataset or operation
leaves everything as the script had it, and one line says which.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any

import torch

from unstall.adapt.detection.hook import adapt_detection
from unstall.adapt.folder import adapted_dataset
from unstall.adapt.recognize import Recipe, Refusal, recognize
from unstall.loader import extensions
from unstall.loader.settings import LoaderArgs

log = logging.getLogger("unstall")

#: The ``prep`` values that replace a torchvision dataset's pipeline.
ADAPTING = ("lean", "gpu", "hybrid", "auto")


def adapt_arguments(dataset: Any, a: LoaderArgs) -> tuple[Any, LoaderArgs]:
    """The dataset the loader runs for ``a.prep`` and the arguments it runs it with
    (``prep``, ``device``, ``pin_memory``, ``device_transform`` set to what the loader itself
    knows). ``dataset`` and ``a`` as they are where no replacement applies (but
    ``prep="lean"`` is then None, the loader's default: the script's own work, which an
    iterable dataset keeps too)."""
    prep = a.prep
    if prep not in ADAPTING:
        return dataset, a
    if callable(getattr(dataset, "fetch", None)):  # unstall's own dataset: its own pipeline
        return dataset, replace(a, prep=None) if prep == "lean" else a
    planned = adapt_detection(dataset, prep, _say)  # a detection pipeline: planned
    if planned is not None:
        return planned, replace(a, prep=None)
    found = recognize(dataset)
    if isinstance(found, Refusal):
        _say(f"unstall: prep={prep!r}: dataset left as it is: {found.reason}")
        return dataset, replace(a, prep=None)
    return _replace(found, prep, a)


def _replace(recipe: Recipe, prep: str, a: LoaderArgs) -> tuple[Any, LoaderArgs]:
    cuda = torch.cuda.is_available()
    if a.device is None and cuda:
        a = replace(a, device="cuda")  # where the loop moves it: its .cuda() then costs nothing
    if not cuda and a.pin_memory:
        a = replace(a, pin_memory=False)  # moot: torch pins nothing without an accelerator
        # either; off, batches cross in zero-copy slots instead of torch's pickled shared memory
    gpu_stage = prep in ("gpu", "hybrid") or (prep == "auto" and cuda)
    why = ""
    if gpu_stage and not recipe.standard:
        why = " (the GPU stage runs RandomResizedCrop + flip only: lean instead)"
    elif gpu_stage and recipe.target_transform is not None:
        why = " (target_transform: lean instead)"
    elif gpu_stage and a.collate_fn not in (None, torch.utils.data.default_collate):
        why = " (a collate_fn of its own: lean instead)"
    if gpu_stage and not why:
        if a.device is None:
            a = replace(a, device="cpu")  # the stage's CPU engine (no GPU here)
        dataset = adapted_dataset(recipe, output="float")
        _say(f"unstall: prep={prep!r}: {recipe.name} prepared by the GPU stage on {a.device}")
        return dataset, a
    on_device = a.device is not None and recipe.to_float
    dataset = adapted_dataset(
        recipe, output="uint8" if on_device or not recipe.to_float else "float"
    )
    if on_device and a.device_transform is None:
        from unstall.loader.device import NormalizeImages

        a = replace(a, device_transform=NormalizeImages(recipe.mean, recipe.std))
    a = replace(a, prep="cpu")
    where = f"normalized on {a.device}" if on_device else "finished in the workers"
    _say(
        f"unstall: prep={prep!r}: {recipe.name} prepared lean ({dataset.transform!r}), {where}{why}"
    )
    return dataset, a


def _say(line: str) -> None:
    """One line on stderr (and the log): what the loader did with the script's dataset."""
    log.info(line)
    print(line, file=sys.stderr, flush=True)


extensions.register("adapt", adapt_arguments)
