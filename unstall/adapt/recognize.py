"""Recognize a torchvision image dataset and its transform: what unstall can run in its place.

A dataset is recognized when it is (or wraps, in `torch.utils.data.Subset`s) a torchvision
`DatasetFolder` (`ImageFolder`) with its own ``__getitem__`` and the default (PIL) loader,
and its ``transform`` is a ``Compose`` (v1 or v2) of operations unstall knows: geometric ops
(``RandomResizedCrop``, ``Resize``, ``CenterCrop``, ``RandomCrop``, ``RandomHorizontalFlip``),
then the tensor ops (``ToTensor``, ``PILToTensor``/``ToImage`` + ``ToDtype``/
``ConvertImageDtype``, ``Normalize``). Anything else gives a `Refusal` whose ``reason``
names the operation, parameter or method at fault, for the one line the loader prints.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data

from unstall.adapt.ops import Op


@dataclass(frozen=True)
class Recipe:
    """A recognized dataset: its samples (absolute paths, targets, in dataset order) and
    the transform as unstall's ops."""

    paths: list[str]
    targets: list[int]
    target_transform: Callable[[Any], Any] | None
    ops: tuple[Op, ...]
    to_float: bool  # the script's batch is float32 in 0-1 (then normalized); else uint8
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str  # e.g. "ImageFolder", "Subset(ImageFolder)"

    @property
    def standard(self) -> bool:
        """RandomResizedCrop (+ flip) to float: what `ImagePipeline` and the GPU stage run."""
        kinds = [op.kind for op in self.ops]
        return self.to_float and kinds in (["random_resized_crop"], ["random_resized_crop", "flip"])


@dataclass(frozen=True)
class Refusal:
    """Why a dataset is left as it is, in words for one line."""

    reason: str


def recognize(dataset: Any) -> Recipe | Refusal:
    """A `Recipe` for ``dataset``, or a `Refusal` naming what unstall does not know."""
    tv = sys.modules.get("torchvision.datasets.folder")
    indices: list[int] | None = None
    names: list[str] = []
    while isinstance(dataset, torch.utils.data.Subset):
        names.append("Subset")
        picked = [int(i) for i in dataset.indices]
        indices = picked if indices is None else [picked[i] for i in indices]
        dataset = dataset.dataset
    cls = type(dataset)
    if tv is None or not isinstance(dataset, tv.DatasetFolder):
        return Refusal(f"{cls.__name__} is not a torchvision DatasetFolder/ImageFolder")
    if cls.__getitem__ is not tv.DatasetFolder.__getitem__:
        return Refusal(f"{cls.__name__} has its own __getitem__")
    if dataset.loader not in (tv.default_loader, tv.pil_loader):
        return Refusal(f"{cls.__name__} loads with {_name(dataset.loader)}, not the default loader")
    if dataset.loader is tv.default_loader and _backend() != "PIL":
        return Refusal(f"torchvision's image backend is {_backend()!r}, not 'PIL'")
    parsed = parse_transform(dataset.transform)
    if isinstance(parsed, Refusal):
        return parsed
    ops, to_float, mean, std = parsed
    samples = dataset.samples if indices is None else [dataset.samples[i] for i in indices]
    name = "".join(f"{n}(" for n in names) + cls.__name__ + ")" * len(names)
    return Recipe(
        paths=[str(p) for p, _ in samples],
        targets=[int(t) for _, t in samples],
        target_transform=dataset.target_transform,
        ops=tuple(ops),
        to_float=to_float,
        mean=mean,
        std=std,
        name=name,
    )


def parse_transform(transform: Any) -> tuple[list[Op], bool, tuple, tuple] | Refusal:
    """``(geometric ops, to_float, mean, std)`` of a torchvision transform, or a `Refusal`."""
    if transform is None:
        return Refusal("transform=None (the loop receives PIL images)")
    steps = getattr(transform, "transforms", None)
    if type(transform).__name__ != "Compose" or not isinstance(steps, Sequence):
        steps = [transform]
    ops: list[Op] = []
    tensor = False  # uint8 tensor (ToImage / PILToTensor) from here on
    to_float = False
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    normalized = False
    for step in steps:
        kind = type(step).__name__
        if not type(step).__module__.startswith("torchvision.transforms"):
            return Refusal(f"transform {_name(step)} is not a torchvision operation")
        if kind in _GEOMETRIC:
            if to_float:
                return Refusal(f"{kind} after the float conversion (unstall resizes uint8)")
            op = _GEOMETRIC[kind](step, tensor)
            if isinstance(op, Refusal):
                return op
            ops.append(op)
        elif kind in ("PILToTensor", "ToImage"):
            tensor = True
        elif kind == "ToTensor":
            tensor = to_float = True
        elif kind in ("ToDtype", "ConvertImageDtype"):
            dtype = getattr(step, "dtype", None)
            scale = getattr(step, "scale", True)
            if dtype != torch.float32 or not scale or not tensor:
                return Refusal(f"{kind}(dtype={dtype}, scale={scale}): unstall makes float32 0-1")
            to_float = True
        elif kind == "Normalize":
            if not to_float or normalized or len(step.mean) != 3 or len(step.std) != 3:
                return Refusal(f"Normalize(mean={step.mean}, std={step.std}) where it stands")
            mean = tuple(float(v) for v in step.mean)
            std = tuple(float(v) for v in step.std)
            normalized = True
        else:
            return Refusal(f"transform {kind} is not one unstall knows")
    if not tensor:
        return Refusal("the transform ends on PIL images (no ToTensor/PILToTensor/ToImage)")
    return ops, to_float, mean, std


def _bilinear(step: Any, tensor: bool) -> Refusal | None:
    mode = getattr(step, "interpolation", None)
    mode_name = getattr(mode, "value", mode)
    if mode_name not in ("bilinear", 2):
        return Refusal(
            f"{type(step).__name__}(interpolation={mode_name}): unstall resizes bilinear"
        )
    if tensor and getattr(step, "antialias", True) is False:
        return Refusal(f"{type(step).__name__}(antialias=False) on tensors")
    return None


def _size(size: Any) -> tuple[int, ...]:
    if isinstance(size, int):
        return (size,)
    return tuple(int(v) for v in size)


def _rrc(step: Any, tensor: bool) -> Op | Refusal:
    bad = _bilinear(step, tensor)
    if bad is not None:
        return bad
    size = _size(step.size)
    size = size * 2 if len(size) == 1 else size
    scale = (float(step.scale[0]), float(step.scale[1]))
    ratio = (float(step.ratio[0]), float(step.ratio[1]))
    return Op("random_resized_crop", size=size, scale=scale, ratio=ratio)


def _resize(step: Any, tensor: bool) -> Op | Refusal:
    bad = _bilinear(step, tensor)
    if bad is not None:
        return bad
    if step.size is None:
        return Refusal("Resize(size=None, max_size=...) is not supported")
    return Op("resize", size=_size(step.size), max_size=getattr(step, "max_size", None))


def _center_crop(step: Any, tensor: bool) -> Op | Refusal:
    size = _size(step.size)
    return Op("center_crop", size=size * 2 if len(size) == 1 else size)


def _random_crop(step: Any, tensor: bool) -> Op | Refusal:
    if step.padding is not None or step.pad_if_needed:
        return Refusal(f"RandomCrop(padding={step.padding}, pad_if_needed={step.pad_if_needed})")
    size = _size(step.size)
    return Op("random_crop", size=size * 2 if len(size) == 1 else size)


def _flip(step: Any, tensor: bool) -> Op | Refusal:
    return Op("flip", p=float(step.p))


_GEOMETRIC: dict[str, Callable[[Any, bool], Op | Refusal]] = {
    "RandomResizedCrop": _rrc,
    "Resize": _resize,
    "CenterCrop": _center_crop,
    "RandomCrop": _random_crop,
    "RandomHorizontalFlip": _flip,
}


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def _backend() -> str:
    import torchvision

    return str(torchvision.get_image_backend())


#: The torchvision operations `parse_transform` takes, by class name: the geometric ones (run
#: on uint8, in the script's order), then those that make the tensor. The docs' "supported data
#: and operations" page is generated from these (docs/gen_reference.py).
GEOMETRIC_OPS: tuple[str, ...] = tuple(_GEOMETRIC)
TENSOR_OPS: tuple[str, ...] = (
    "ToTensor",
    "PILToTensor",
    "ToImage",
    "ToDtype",
    "ConvertImageDtype",
    "Normalize",
)
