"""`DetectionPlan`: a v2 detection pipeline run as a plan: boxes first, pixels once.

Called as the script's ``Compose`` is, ``plan(image, target) -> (image, target)``, it goes
through the steps (`unstall.adapt.detection.steps`) in the script's order and:

- draws every random choice as torchvision's op does in ``forward``, from the same
  generator (torch's global one): the ``p`` draw of a ``_RandomApplyTransform`` first,
  then the op's own ``make_params`` on inputs of the image's size (a stand-in that holds
  no pixels), so the draws are torchvision's for the same generator state;
- applies each geometric op to the target with the op's own ``transform`` (boxes in any
  format, ``tv_tensors.Mask``: torchvision's result for the same draws; other keys as they
  are), and records its effect on the pixels per axis (`resample.AxisOp`);
- runs the target and type ops (``SanitizeBoundingBoxes``, ``ToDtype``...) as they are;
- makes the output pixels in one resampling step from the decoded image (the zoom-out
  fill where the canvas has no image, flips folded in: `resample`), then the photometric
  ops at output size.

Where it differs from torchvision's order: the photometric ops of a pipeline that distorts
colours before its geometry (the SSD preset) run on the resampled image, not on the source
(they are per-pixel, but clamped and rounded, so the order moves values by a grey level or
so); contrast's mean grey is taken over a 1/8-size thumbnail of the whole source (torchvision:
over the whole source); and pixels are resampled once (torchvision: uint8 after each op).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2._transform import _RandomApplyTransform
from torchvision.transforms.v2._utils import get_bounding_boxes, query_size

from unstall.adapt.detection.draws import iou_crop_params
from unstall.adapt.detection.resample import (
    AxisOp,
    Taps,
    axis_taps,
    paste,
    reduce_taps,
    resample,
)
from unstall.adapt.detection.steps import Step
from unstall.pipeline.decode import DCT_SCALES, decode_jpeg

_GREY = torch.tensor([0.2989, 0.587, 0.114])


class DetectionPlan:
    """The script's v2 ``Compose`` as a plan (see the module's docstring). Picklable."""

    def __init__(self, steps: Sequence[Step], name: str = "Compose"):
        self.steps = tuple(steps)
        self.name = name
        kinds = [s.kind for s in self.steps]
        geometry = [i for i, k in enumerate(kinds) if k == "geometry"]
        self._colour_first = bool(geometry) and any(
            k == "photometric" and i < geometry[0] for i, k in enumerate(kinds)
        )
        #: the decodes deferred in the current ``dataset[i]`` call (`decode.Deferred`), set
        #: by `unstall.adapt.detection.dataset` around the call
        self.deferred: Any = None

    def __repr__(self) -> str:
        return f"DetectionPlan([{', '.join(s.name for s in self.steps)}])"

    def __call__(self, image: Any, target: Any = None) -> Any:
        return self.run(image, target)

    def geometry(self, height: int, width: int, image: Any, target: Any) -> Any:
        """Draw and apply the geometry to ``target`` for an image of that size (``image``: a
        stand-in of the script's image type and dtype): the `Layout` (per-axis chains,
        output size, fill, photometric draws) and the new target."""
        channels = _channels(image)
        layout = Layout(height, width, channels)
        leaves, spec = tree_flatten(target)
        marker: Any = image
        for step in self.steps:
            op = step.op
            if step.kind in ("geometry", "photometric"):
                full = tv_tensors.Image(
                    torch.empty((channels, 1, 1), dtype=torch.uint8).expand(
                        channels, layout.h, layout.w
                    )
                )
                flat = [full, *leaves]
                op.check_inputs(flat)
                layout.float_stage = _is_float(marker)
                if isinstance(op, _RandomApplyTransform) and torch.rand(1) >= op.p:
                    continue  # _RandomApplyTransform.forward's draw
                needs = op._needs_transform_list(flat)
                params = _make_params(op, [x for x, n in zip(flat, needs, strict=True) if n])
                if step.kind == "photometric":
                    layout.colour.append((params, _is_float(marker)))
                    continue
                leaves = [
                    op.transform(x, params) if n else x
                    for x, n in zip(leaves, needs[1:], strict=True)
                ]
                layout.apply(op, params)
            else:
                out = op(marker, tree_unflatten(leaves, spec))
                marker, target_out = out
                leaves, spec = tree_flatten(target_out)
                if step.kind == "image":
                    layout.image_ops.append(op)
        layout.final_marker = marker
        return layout, tree_unflatten(leaves, spec)

    def run(self, image: Any, target: Any) -> tuple[Any, Any]:
        """``(image, target)`` as the script's ``Compose`` returns them."""
        source = as_source(image)
        _, full_h, full_w = source.shape
        later = self.deferred.take(source) if self.deferred is not None else None
        layout, target = self.geometry(full_h, full_w, stand_in(image), target)
        scale = 1
        if later is not None:  # decode now, at the scale the output allows
            data, decode_full = later
            scale = layout.dct_scale()
            if scale == 1:
                source = as_source(decode_full())
            else:
                array = decode_jpeg(data, scale=scale)
                source = torch.from_numpy(array).permute(2, 0, 1)
        out = layout.pixels(source, scale, self._colour_first)
        return layout.finish(out, image), target


class Layout:
    """The geometry drawn for one sample: each axis's chain from the source to the output,
    the output size, the canvas fill and the photometric draws."""

    def __init__(self, height: int, width: int, channels: int):
        self.src_h, self.src_w, self.channels = height, width, channels
        self.h, self.w = height, width
        self.rows: list[AxisOp] = []
        self.cols: list[AxisOp] = []
        self.fill: list[float] | None = None
        self.colour: list[tuple[dict[str, Any], bool]] = []
        self.image_ops: list[Any] = []
        self.float_stage = False
        self.final_marker: Any = None

    def apply(self, op: Any, params: dict[str, Any]) -> None:
        """Record a geometric op's effect on the pixel grid."""
        kind = type(op).__name__
        h, w = self.h, self.w
        if kind == "RandomZoomOut":
            left, top, right, bottom = params["padding"]
            self.cols.append(("pad", w, (left, right)))
            self.rows.append(("pad", h, (top, bottom)))
            self.fill = _fill_values(op, self.channels)
            self.h, self.w = h + top + bottom, w + left + right
        elif kind == "RandomIoUCrop":
            if not params:
                return
            self.cols.append(("crop", w, (params["left"], params["width"])))
            self.rows.append(("crop", h, (params["top"], params["height"])))
            self.h, self.w = params["height"], params["width"]
        elif kind == "RandomHorizontalFlip":
            self.cols.append(("flip", w, ()))
        elif kind == "RandomVerticalFlip":
            self.rows.append(("flip", h, ()))
        else:  # a resize: its size from torchvision's own rule, through empty boxes
            size = params.get("size", getattr(op, "size", None))
            probe = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(h, w))
            if kind == "Resize":
                probe = op.transform(probe, params)
            else:
                probe = TF.resize(probe, size=list(size))
            nh, nw = probe.canvas_size
            if (nh, nw) != (h, w):
                self.rows.append(("resize", h, (nh,)))
                self.cols.append(("resize", w, (nw,)))
            self.h, self.w = nh, nw

    def taps(self, scale: int, sh: int, sw: int) -> tuple[Taps, Taps]:
        """Both axes' taps, into a source decoded at ``1/scale`` (``sh x sw``)."""
        rows, cols = axis_taps(self.rows, self.h), axis_taps(self.cols, self.w)
        if scale > 1:  # a decoded pixel stands for the `scale` full-size pixels it covers
            rows, cols = reduce_taps(rows, scale, sh), reduce_taps(cols, scale, sw)
        return rows, cols

    def dct_scale(self) -> int:
        """The largest DCT downscale (1, 2, 4, 8) that keeps at least one decoded pixel per
        output pixel along both axes (the rule of `unstall.pipeline.crop.dct_scale`)."""
        fy, fx = self.reduction()
        return max((s for s in DCT_SCALES if fy >= s and fx >= s), default=1)

    def reduction(self) -> tuple[float, float]:
        """Source pixels per output pixel, along rows and columns (the resizes' product)."""
        fy = fx = 1.0
        for kind, n_in, args in self.rows:
            if kind == "resize":
                fy *= n_in / args[0]
        for kind, n_in, args in self.cols:
            if kind == "resize":
                fx *= n_in / args[0]
        return fy, fx

    def pixels(self, source: torch.Tensor, scale: int, colour_first: bool) -> torch.Tensor:
        """The output image, float32 on the 0-255 scale (uint8-valued where torchvision's
        pipeline holds uint8 there)."""
        _, sh, sw = source.shape
        resizes = any(op[0] == "resize" for op in (*self.rows, *self.cols))
        if scale == 1 and not resizes and source.dtype == torch.uint8:
            return self._paste(source, colour_first)
        rows, cols = self.taps(scale, sh, sw)
        image = resample(source, rows, cols)
        cover = rows.coverage[:, None] * cols.coverage[None, :]
        fill = self._fill_tensor()
        blank = bool((cover < 1.0 - 1e-6).any())
        uint8 = not (self.colour and self.colour[0][1])
        if self.colour and colour_first:
            if blank:
                image = image / cover.clamp(min=1e-6)
            mean = _thumbnail_mean(source, self.colour[0][0])
            image = distort(image, self.colour[0][0], uint8, mean).to(torch.float32)
            if blank:
                image = image * cover + fill * (1 - cover)
        elif blank:
            image = image + fill * (1 - cover)
        if self.colour and not colour_first:
            image = distort(image, self.colour[0][0], uint8, None).to(torch.float32)
        return image

    def _paste(self, source: torch.Tensor, colour_first: bool) -> torch.Tensor:
        """`pixels` without a resize: whole pixels moved (uint8 out), colours on the source's
        visible part first, or on the output after, as the pipeline orders them."""
        uint8 = not (self.colour and self.colour[0][1])
        params = self.colour[0][0] if self.colour else None

        def colour(part: torch.Tensor) -> torch.Tensor:
            assert params is not None
            mean = _thumbnail_mean(source, params)
            out = distort(part.to(torch.float32), params, uint8, mean)
            return out.round_().clamp_(0, 255).to(torch.uint8) if uint8 else out

        first = colour if params is not None and colour_first else None
        base = source if uint8 or first is None else source.to(torch.float32)
        image = paste(base, self.rows, self.cols, (self.h, self.w), self._fill_tensor(), first)
        if params is not None and not colour_first:
            image = distort(image.to(torch.float32), params, uint8, None)
        return image

    def finish(self, image: torch.Tensor, source: Any) -> Any:
        """The float 0-255 output as the script's pipeline has it: uint8 or float as the
        image was at its last pixel op, of the source's type (a tensor for PIL), then the
        pipeline's type ops in order (``ToImage``, ``ToDtype``, ``Normalize``...)."""
        if self.float_stage:
            out: Any = image.to(torch.float32).div_(255.0)
        elif image.dtype == torch.uint8:
            out = image
        else:
            out = image.round_().clamp_(0, 255).to(torch.uint8)
        if isinstance(source, tv_tensors.Image):
            out = tv_tensors.Image(out)
        for op in self.image_ops:
            out = op(out)
        if isinstance(self.final_marker, PIL.Image.Image):  # the script's pipeline ends on PIL
            out = PIL.Image.fromarray(out.permute(1, 2, 0).squeeze(-1).numpy())
        return out

    def _fill_tensor(self) -> torch.Tensor:
        values = self.fill if self.fill is not None else [0.0] * self.channels
        return torch.tensor(values, dtype=torch.float32)[:, None, None]


def _make_params(op: Any, flat: list[Any]) -> dict[str, Any]:
    """``op.make_params(flat)``; ``RandomIoUCrop``'s through `iou_crop_params` (the same
    draws and result, without torch's per-op cost in its rejection loop)."""
    if type(op).__name__ == "RandomIoUCrop":
        h, w = query_size(flat)
        return iou_crop_params(op, h, w, get_bounding_boxes(flat))
    return op.make_params(flat)


def distort(
    image: torch.Tensor, params: dict[str, Any], uint8: bool, mean: float | None
) -> torch.Tensor:
    """``RandomPhotometricDistort.transform`` with its drawn ``params``, on a float 0-255
    image: as uint8 (torchvision's ops on uint8 images, each truncating), or as float 0-1;
    contrast's mean grey ``mean`` (0-255), or the image's own where None."""
    img = image.round().clamp_(0, 255).to(torch.uint8) if uint8 else image / 255.0
    bound = 255.0 if uint8 else 1.0
    scale = 1.0 if uint8 else 255.0

    def contrast(x: torch.Tensor) -> torch.Tensor:
        f = float(params["contrast_factor"])
        if mean is None:
            return TF.adjust_contrast(x, contrast_factor=f)
        out = x.to(torch.float32).mul(f).add_(mean / scale * (1.0 - f)).clamp_(0, bound)
        return out.to(x.dtype)

    if params["brightness_factor"] is not None:
        img = TF.adjust_brightness(img, brightness_factor=params["brightness_factor"])
    if params["contrast_factor"] is not None and params["contrast_before"]:
        img = contrast(img)
    if params["saturation_factor"] is not None:
        img = TF.adjust_saturation(img, saturation_factor=params["saturation_factor"])
    if params["hue_factor"] is not None:
        img = TF.adjust_hue(img, hue_factor=params["hue_factor"])
    if params["contrast_factor"] is not None and not params["contrast_before"]:
        img = contrast(img)
    if params["channel_permutation"] is not None:
        img = TF.permute_channels(img, permutation=params["channel_permutation"])
    return img.to(torch.float32) if uint8 else img * 255.0


def _thumbnail_mean(source: torch.Tensor, params: dict[str, Any]) -> float | None:
    """Contrast's mean grey over the whole source (as torchvision takes it before the
    geometry), on a 1/8-size thumbnail with the ops drawn before contrast applied."""
    if params["contrast_factor"] is None or source.shape[0] != 3:
        return None
    _, h, w = source.shape
    thumb = source if source.dtype == torch.uint8 else source.round().clamp(0, 255).byte()
    thumb = F.interpolate(
        thumb[None], size=(max(1, h // 8), max(1, w // 8)), mode="bilinear", antialias=True
    )[0]
    if params["brightness_factor"] is not None:
        thumb = TF.adjust_brightness(thumb, brightness_factor=params["brightness_factor"])
    if not params["contrast_before"]:
        if params["saturation_factor"] is not None:
            thumb = TF.adjust_saturation(thumb, saturation_factor=params["saturation_factor"])
        if params["hue_factor"] is not None:
            thumb = TF.adjust_hue(thumb, hue_factor=params["hue_factor"])
    grey = (thumb.to(torch.float32) * _GREY[:, None, None]).sum(0).floor_()
    return float(grey.mean())


def as_source(image: Any) -> torch.Tensor:
    """The script's decoded image as a ``C x H x W`` tensor (PIL: uint8, no copy made
    beyond PIL's own array; tensors as they are, float ones put on the 0-255 scale)."""
    if isinstance(image, PIL.Image.Image):
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        array = np.asarray(image)  # PIL's buffer, read-only: never written here
        if array.ndim == 2:
            array = array[:, :, None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "not writable": it is only read
            return torch.from_numpy(array).permute(2, 0, 1)
    if isinstance(image, torch.Tensor):
        data = image.as_subclass(torch.Tensor)
        if data.dtype == torch.uint8:
            return data
        if data.is_floating_point():
            return data.to(torch.float32) * 255.0
    raise TypeError(
        f"the dataset's image is a {type(image).__name__}: unstall plans PIL images or tensors"
    )


def stand_in(image: Any) -> Any:
    """A 1x1 image of ``image``'s type, mode and dtype: what the type ops are run on."""
    if isinstance(image, PIL.Image.Image):
        return PIL.Image.new("L" if image.mode == "L" else "RGB", (1, 1))
    tiny = torch.zeros((image.shape[-3], 1, 1), dtype=image.dtype)
    return tv_tensors.Image(tiny) if isinstance(image, tv_tensors.Image) else tiny


def _channels(image: Any) -> int:
    if isinstance(image, PIL.Image.Image):
        return 1 if image.mode == "L" else 3
    return int(image.shape[-3])


def _is_float(marker: Any) -> bool:
    return isinstance(marker, torch.Tensor) and marker.is_floating_point()


def _fill_values(op: Any, channels: int) -> list[float]:
    from torchvision.transforms.v2._utils import _get_fill, _setup_fill_arg

    fill = _get_fill(_setup_fill_arg(op.fill), tv_tensors.Image)  # as the op resolves it
    if fill is None:
        return [0.0] * channels
    values = [float(v) for v in fill] if isinstance(fill, (list, tuple)) else [float(fill)]
    values = values * channels if len(values) == 1 else values
    # F.pad on uint8 images makes a uint8 fill tensor (truncates, as torchvision does)
    return torch.tensor(values).to(torch.uint8).to(torch.float32).tolist()
