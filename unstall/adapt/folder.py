"""The unstall dataset a recognized torchvision one becomes: same files, labels, order.

`adapted_dataset` turns a `Recipe` into a `TorchvisionFolder`: a `FileDataset` over the
same files (a local store rooted at their common folder), with the same targets and
``target_transform``, whose transform is `ImagePipeline` (the standard training pipeline,
which the GPU stage can also run) or `FolderPipeline` (any other recognized chain).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from unstall.adapt.ops import FolderPipeline
from unstall.adapt.recognize import Recipe
from unstall.data import FileDataset
from unstall.pipeline.transforms import ImagePipeline
from unstall.stores import LocalStore


class TorchvisionFolder(FileDataset):
    """A `FileDataset` that also applies the script's ``target_transform`` to each label."""

    def __init__(
        self,
        root: str,
        keys: list[str],
        *,
        labels: list[int],
        transform: Callable[[bytes], Any],
        target_transform: Callable[[Any], Any] | None,
        name: str,
    ):
        super().__init__(LocalStore(root), keys, labels=labels, transform=transform)
        self.target_transform = target_transform
        self.name = name

    def prepare(self, index: int, raw: bytes) -> Any:
        out = super().prepare(index, raw)
        if self.target_transform is None:
            return out
        try:
            return out[0], self.target_transform(out[1])
        except Exception as exc:
            raise self.sample_error(index, exc, "target_transform") from exc


def build_transform(recipe: Recipe, *, output: str) -> ImagePipeline | FolderPipeline:
    """The recipe's transform as unstall's: `ImagePipeline` where it is the standard one."""
    if recipe.standard:
        crop = recipe.ops[0]
        flip_p = recipe.ops[1].p if len(recipe.ops) > 1 else 0.0
        return ImagePipeline(
            (crop.size[0], crop.size[1]),
            output=output,
            scale=crop.scale,
            ratio=crop.ratio,
            flip_p=flip_p,
            mean=recipe.mean,
            std=recipe.std,
        )
    return FolderPipeline(recipe.ops, output=output, mean=recipe.mean, std=recipe.std)


def adapted_dataset(recipe: Recipe, *, output: str) -> TorchvisionFolder:
    """A `TorchvisionFolder` over the recipe's files, ``output`` ``"float"`` or ``"uint8"``."""
    paths = [os.path.abspath(p) for p in recipe.paths]  # normalized: "//", "..", relative
    root = os.path.commonpath(sorted({os.path.dirname(p) for p in paths}))
    cut = len(os.path.join(root, ""))  # ImageNet's 1.28M paths: a slice each, not relpath
    keys = [p[cut:].replace(os.sep, "/") for p in paths]
    return TorchvisionFolder(
        root,
        keys,
        labels=recipe.targets,
        transform=build_transform(recipe, output=output),
        target_transform=recipe.target_transform,
        name=recipe.name,
    )
