"""The plan against real torchvision: the same draws give the same boxes, labels and kept
set, exactly; pixels within the tolerance the docs state (docs/guide/detection.md)."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2 as T

from tests.adapt.detection.samples import FILL, PRESETS, sample, tail
from unstall.adapt.detection import DetectionPlan, read_steps

#: per-image pixel difference (grey levels of 255) the docs state: (mean, worst)
GEOMETRY_TOLERANCE = (0.5, 2.0)
COLOUR_TOLERANCE = (2.0, 40.0)


def _both(compose, seed: int, image, target):
    plan = DetectionPlan(read_steps(compose))
    torch.manual_seed(seed)
    theirs = compose(image, target)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    ours = plan(image, target)
    assert torch.equal(torch.get_rng_state(), state)  # the same draws, no more, no fewer
    return theirs, ours


def _same_target(theirs: dict, ours: dict) -> None:
    assert theirs.keys() == ours.keys()
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), key
        if isinstance(value, torch.Tensor):
            assert value.dtype == ours[key].dtype and torch.equal(value, ours[key]), key
        else:
            assert value == ours[key], key
    boxes = theirs["boxes"]
    if isinstance(boxes, tv_tensors.BoundingBoxes):
        assert boxes.format == ours["boxes"].format
        assert boxes.canvas_size == ours["boxes"].canvas_size


def _pixels(theirs, ours) -> tuple[float, float]:
    assert type(ours) is type(theirs) and ours.dtype == theirs.dtype
    assert ours.shape == theirs.shape
    scale = 255.0 if theirs.is_floating_point() else 1.0
    d = (theirs.float() - ours.float()).abs() * scale
    return float(d.mean()), float(d.max())


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("fmt", ["XYXY", "XYWH", "CXCYWH"])
def test_presets_give_torchvisions_boxes_labels_and_kept_set(preset: str, fmt: str) -> None:
    compose = PRESETS[preset]()
    colour = preset in ("ssd", "reference_ssd")
    mean_tol, worst_tol = COLOUR_TOLERANCE if colour else GEOMETRY_TOLERANCE
    means = []
    for seed in range(6):
        image, target = sample(seed, n=1 + seed % 8, fmt=fmt)
        (img_a, tgt_a), (img_b, tgt_b) = _both(compose, seed, image, target)
        _same_target(tgt_a, tgt_b)
        mean, worst = _pixels(img_a, img_b)
        assert worst <= worst_tol, (seed, mean, worst)
        means.append(mean)
    assert sum(means) / len(means) <= mean_tol


OPS = {
    "RandomZoomOut": T.RandomZoomOut(fill=FILL, p=1.0),
    "RandomIoUCrop": T.RandomIoUCrop(),
    "RandomHorizontalFlip": T.RandomHorizontalFlip(p=1.0),
    "RandomVerticalFlip": T.RandomVerticalFlip(p=1.0),
    "Resize": T.Resize(100),
    "RandomShortestSize": T.RandomShortestSize(min_size=(80, 300), max_size=400),
    "ScaleJitter": T.ScaleJitter(target_size=(120, 160)),
    "RandomPhotometricDistort": T.RandomPhotometricDistort(p=1.0),
    "ClampBoundingBoxes": T.ClampBoundingBoxes(),
    "ConvertBoundingBoxFormat": T.ConvertBoundingBoxFormat("CXCYWH"),
    "ToPureTensor": T.ToPureTensor(),
    "Normalize": T.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_op_alone(name: str) -> None:
    op = OPS[name]
    ops = [T.ToDtype(torch.float32, scale=True), op] if name == "Normalize" else [op]
    last = [] if name == "ToPureTensor" else [T.SanitizeBoundingBoxes()]  # needs BoundingBoxes
    compose = T.Compose([*ops, *last])
    mean_tol, worst_tol = COLOUR_TOLERANCE if "Photometric" in name else GEOMETRY_TOLERANCE
    for seed in range(6):
        image, target = sample(seed, n=2 + seed, fmt=("XYXY", "XYWH", "CXCYWH")[seed % 3])
        (img_a, tgt_a), (img_b, tgt_b) = _both(compose, seed, image, target)
        _same_target(tgt_a, tgt_b)
        mean, worst = _pixels(img_a, img_b)
        scale = 1.0 if name != "Normalize" else 1 / 0.2  # normalized values: std 0.2 at most
        assert mean <= mean_tol * scale and worst <= worst_tol * scale, (seed, mean, worst)


def test_pil_and_pure_tensor_images_keep_their_types() -> None:
    """A PIL image through ToImage, and a plain uint8 tensor with no conversion: the plan
    returns what the pipeline does (tv Image / plain tensor, same dtype)."""
    image, target = sample(3)
    pil = T.ToPILImage()(image)
    compose = T.Compose([T.RandomIoUCrop(), T.Resize((64, 64)), T.ToImage(), *tail()])
    (a, ta), (b, tb) = _both(compose, 3, pil, target)
    assert type(a) is type(b) is tv_tensors.Image
    _same_target(ta, tb)
    plain = image.as_subclass(torch.Tensor)
    compose = T.Compose([T.RandomHorizontalFlip(p=1.0), T.Resize((50, 70))])
    (a, ta), (b, tb) = _both(compose, 4, plain, target)
    assert type(a) is type(b) is torch.Tensor and a.dtype == b.dtype == torch.uint8
    assert _pixels(a, b)[1] <= 1.0
    _same_target(ta, tb)


def test_zoom_out_fill_and_flip_are_exact_where_nothing_is_resampled() -> None:
    """Zoom-out + flip alone move whole pixels: the plan's output is torchvision's, equal."""
    compose = T.Compose([T.RandomZoomOut(fill=FILL, p=1.0), T.RandomHorizontalFlip(p=1.0)])
    for seed in range(4):
        image, target = sample(seed)
        (a, ta), (b, tb) = _both(compose, seed, image, target)
        assert torch.equal(a, b)
        _same_target(ta, tb)
