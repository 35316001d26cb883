"""A torchvision ``transforms.v2`` detection ``Compose``, read as steps unstall can plan.

Each op is one of four kinds:

- ``geometry``: ``RandomZoomOut``, ``RandomIoUCrop``, ``RandomHorizontalFlip``,
  ``RandomVerticalFlip``, ``Resize``, ``RandomShortestSize``, ``ScaleJitter``: their draws
  are torchvision's own (``make_params``), their effect on the boxes torchvision's own
  (``transform``), their effect on the pixels one resampling step (`resample`);
- ``photometric``: ``RandomPhotometricDistort``, done on the output's pixels; all of them
  before the first geometric op or after the last;
- ``image``: ``ToImage``, ``PILToTensor``, ``ToDtype``, ``ConvertImageDtype``, ``Normalize``,
  ``ToPureTensor``: run as they are, on the output (and on the target, where they touch it);
- ``target``: ``SanitizeBoundingBoxes``, ``ClampBoundingBoxes``,
  ``ConvertBoundingBoxFormat``: run as they are on the target.

Anything else (or a parameter unstall does not reproduce: an interpolation other than
bilinear with antialiasing) gives a `Refusal` naming it. `nothing_to_fold` says when a
pipeline that can be planned gains nothing by it (no op whose pixels a plan folds away).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unstall.adapt.recognize import Refusal

GEOMETRY = (
    "RandomZoomOut",
    "RandomIoUCrop",
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "Resize",
    "RandomShortestSize",
    "ScaleJitter",
)
PHOTOMETRIC = ("RandomPhotometricDistort",)
IMAGE = ("ToImage", "PILToTensor", "ToDtype", "ConvertImageDtype", "Normalize", "ToPureTensor")
TARGET = ("SanitizeBoundingBoxes", "ClampBoundingBoxes", "ConvertBoundingBoxFormat")
_RESIZING = ("Resize", "RandomShortestSize", "ScaleJitter")
#: The ops whose pixels a plan folds away (the canvas never painted, the cropped-away and
#: averaged-down pixels never made): without one, a plan does the script's work plus its
#: own bookkeeping (hflip preset: 0.91x the CPU per sample, 0.80x end to end).
FOLDED = ("RandomZoomOut", "RandomIoUCrop", *_RESIZING)


@dataclass(frozen=True)
class Step:
    """One op of the pipeline and its kind (``geometry``, ``photometric``, ``image``,
    ``target``)."""

    kind: str
    op: Any

    @property
    def name(self) -> str:
        return type(self.op).__name__


def read_steps(transforms: Any) -> list[Step] | Refusal:
    """The steps of a v2 ``Compose`` (or of one v2 op), or a `Refusal` naming the first op
    or parameter unstall does not plan."""
    ops = getattr(transforms, "transforms", None)
    if type(transforms).__name__ != "Compose" or not isinstance(ops, Sequence):
        ops = [transforms]
    steps: list[Step] = []
    for op in ops:
        kind = type(op).__name__
        module = type(op).__module__
        if not module.startswith("torchvision.transforms.v2"):
            tv = module.startswith("torchvision")
            where = "a torchvision v1 op" if tv else "not torchvision's"
            return Refusal(f"transform {_qualname(op)} is {where} (unstall plans transforms.v2)")
        if kind in GEOMETRY:
            bad = _check_geometry(op)
            if bad is not None:
                return bad
            steps.append(Step("geometry", op))
        elif kind in PHOTOMETRIC:
            steps.append(Step("photometric", op))
        elif kind in IMAGE:
            steps.append(Step("image", op))
        elif kind in TARGET:
            steps.append(Step("target", op))
        else:
            return Refusal(f"transform {kind} is not one unstall plans")
    return _check_order(steps)


def nothing_to_fold(steps: Sequence[Step]) -> Refusal | None:
    """A `Refusal` saying so where ``steps`` hold none of the `FOLDED` ops (a flip, colours,
    type ops alone: the plan would cost more than the pipeline as it is), else None."""
    if any(s.name in FOLDED for s in steps):
        return None
    return Refusal(
        "nothing to fold (no zoom-out, IoU crop or resize to plan): a plan would cost more "
        "than the pipeline as it is"
    )


def _check_geometry(op: Any) -> Refusal | None:
    kind = type(op).__name__
    if kind in _RESIZING:
        mode = getattr(op.interpolation, "value", op.interpolation)
        if mode not in ("bilinear", 2):
            return Refusal(f"{kind}(interpolation={mode}): unstall resamples bilinear")
        if op.antialias is not True:
            return Refusal(f"{kind}(antialias={op.antialias}): unstall resamples antialiased")
    return None


def _check_order(steps: list[Step]) -> list[Step] | Refusal:
    geometry = [i for i, s in enumerate(steps) if s.kind == "geometry"]
    if geometry:
        first, last = geometry[0], geometry[-1]
        for i, s in enumerate(steps):
            if s.kind == "photometric" and first < i < last:
                return Refusal(
                    f"{s.name} between geometric ops (unstall distorts colours before or after "
                    "all of them)"
                )
    pixel = [i for i, s in enumerate(steps) if s.kind in ("geometry", "photometric")]
    for i, s in enumerate(steps):
        if s.name == "Normalize" and pixel and i < pixel[-1]:
            return Refusal(f"Normalize before {steps[pixel[-1]].name} (unstall normalizes last)")
    zoom = [s for s in steps if s.name == "RandomZoomOut"]
    if len(zoom) > 1:
        return Refusal("two RandomZoomOut ops (unstall fills one canvas)")
    return steps


def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__
