"""Where a detection pipeline sits in the script's dataset, and what it is.

`find_detection` looks through `torch.utils.data.Subset` wrappers for the dataset that
calls a torchvision ``transforms.v2`` pipeline with ``(image, target)``:

- torchvision's ``wrap_dataset_for_transforms_v2`` wrapper (``CocoDetection``,
  ``VOCDetection``...: boxes as ``BoundingBoxes``), its ``transforms``;
- a torchvision ``VisionDataset`` given ``transforms=`` (not ``transform=``, which it calls
  on the image alone);
- the script's own Dataset class whose ``__getitem__`` calls ``self.transforms(a, b)`` or
  ``self.transform(a, b)`` (read from its source).

It answers None where the dataset is none of these (an ``ImageFolder``: classification,
`unstall.adapt.recognize`'s), a `Refusal` where it is one but the pipeline holds an op
unstall does not plan, or nothing a plan folds away (a flip alone: `steps.nothing_to_fold`),
else a `Found`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import torch.utils.data

from unstall.adapt.detection.steps import Step, nothing_to_fold, read_steps
from unstall.adapt.recognize import Refusal


@dataclass(frozen=True)
class Found:
    """The dataset object whose attribute ``attr`` is the pipeline, its steps, a name."""

    owner: Any
    attr: str
    steps: list[Step]
    name: str


def find_detection(dataset: Any, *, even_idle: bool = False) -> Found | Refusal | None:
    """The detection pipeline in ``dataset`` (see the module's docstring). ``even_idle``:
    a pipeline with nothing to fold is found anyway (``prep="lean"`` leaves it as it is;
    `unstall bench detection` plans it to show what a plan would cost there)."""
    names: list[str] = []
    while isinstance(dataset, torch.utils.data.Subset):
        names.append("Subset")
        dataset = dataset.dataset
    attr, label = _pipeline_attr(dataset)
    if attr is None:
        return None
    pipeline = getattr(dataset, attr)
    if not _is_v2(pipeline):
        return Refusal(f"{label}.{attr} is not a torchvision transforms.v2 pipeline")
    steps = read_steps(pipeline)
    if isinstance(steps, Refusal):
        return steps
    idle = nothing_to_fold(steps)
    if idle is not None and not even_idle:
        return idle
    name = "".join(f"{n}(" for n in names) + label + ")" * len(names)
    return Found(owner=dataset, attr=attr, steps=steps, name=name)


def _pipeline_attr(dataset: Any) -> tuple[str | None, str]:
    """``(attribute, dataset's name)``: the attribute holding the pipeline, or None."""
    cls = type(dataset)
    if any(c.__name__ == "VisionDatasetTVTensorWrapper" for c in cls.__mro__):
        # wrap_dataset_for_transforms_v2: a class made per dataset class, "Wrapped<Name>"
        inner = cls.__name__.removeprefix("Wrapped")
        return ("transforms" if dataset.transforms is not None else None), inner
    vision = _torchvision_class("torchvision.datasets.vision", "VisionDataset")
    folder = _torchvision_class("torchvision.datasets.folder", "DatasetFolder")
    if folder is not None and isinstance(dataset, folder):
        return None, cls.__name__  # classification: unstall.adapt.recognize's
    if vision is not None and isinstance(dataset, vision) and _calls_pair(cls) is None:
        transforms = getattr(dataset, "transforms", None)
        if transforms is None or type(transforms).__name__ == "StandardTransform":
            return None, cls.__name__
        return "transforms", cls.__name__
    attr = _calls_pair(cls)
    if attr is None or getattr(dataset, attr, None) is None:
        return None, cls.__name__
    return attr, cls.__name__


def _calls_pair(cls: type) -> str | None:
    """``"transforms"``/``"transform"`` where ``cls.__getitem__``'s source calls
    ``self.<attr>(a, b)`` (two arguments: the image and the target)."""
    getitem = getattr(cls, "__getitem__", None)
    if getitem is None or not hasattr(getitem, "__code__"):
        return None
    names = getitem.__code__.co_names
    if "transforms" not in names and "transform" not in names:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getitem)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr in ("transforms", "transform")
            and len(node.args) == 2
        ):
            return node.func.attr
    return None


def _is_v2(pipeline: Any) -> bool:
    return type(pipeline).__module__.startswith("torchvision.transforms.v2")


def _torchvision_class(module: str, name: str) -> Any:
    import sys

    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None
