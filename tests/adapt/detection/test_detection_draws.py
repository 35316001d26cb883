"""The draws follow torchvision's laws (bounded, seeded samples), and RandomIoUCrop's fast
rejection loop is torchvision's ``make_params`` bit for bit."""

from __future__ import annotations

import math

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2 as T
from torchvision.transforms.v2 import functional as TF

from tests.adapt.detection.samples import FILL, sample
from unstall.adapt.detection import DetectionPlan, read_steps
from unstall.adapt.detection.draws import iou_crop_params

DRAWS = 250


def _within(count: int, n: int, p: float) -> bool:
    """``count`` of ``n`` Bernoulli(p) trials inside 4.5 standard deviations (a false
    alarm about once in 150,000 runs)."""
    return abs(count - n * p) <= 4.5 * math.sqrt(n * p * (1 - p))


def _layouts(compose, n: int = DRAWS):
    plan = DetectionPlan(read_steps(compose))
    image, target = sample(0, h=120, w=160, n=4)
    for seed in range(n):
        torch.manual_seed(10_000 + seed)
        yield plan.geometry(120, 160, image[:, :1, :1], target)[0]


def test_zoom_out_flip_and_photometric_laws() -> None:
    ops = [T.RandomPhotometricDistort(), T.RandomZoomOut(fill=FILL), T.RandomHorizontalFlip()]
    zoomed = flipped = 0
    sides: list[float] = []
    colour = {"brightness_factor": 0, "contrast_factor": 0, "saturation_factor": 0}
    colour.update(hue_factor=0, channel_permutation=0)
    before = 0
    ranges = {
        "brightness_factor": (0.875, 1.125),
        "contrast_factor": (0.5, 1.5),
        "saturation_factor": (0.5, 1.5),
        "hue_factor": (-0.05, 0.05),
    }
    for layout in _layouts(T.Compose(ops)):
        pads = [op for op in layout.cols if op[0] == "pad"]
        if pads:
            zoomed += 1
            canvas = 160 + sum(pads[0][2])
            sides.append(canvas / 160)
            assert 1.0 <= canvas / 160 <= 4.0
            assert 0 <= pads[0][2][0] <= canvas - 160
        flipped += any(op[0] == "flip" for op in layout.cols)
        ((params, _),) = layout.colour
        before += params["contrast_before"]
        for key in colour:
            if params[key] is not None:
                colour[key] += 1
                if key in ranges:
                    lo, hi = ranges[key]
                    assert lo <= float(params[key]) <= hi
                else:
                    assert sorted(params[key].tolist()) == [0, 1, 2]
    assert _within(zoomed, DRAWS, 0.5) and _within(flipped, DRAWS, 0.5)
    assert _within(before, DRAWS, 0.5)
    assert all(_within(c, DRAWS, 0.5) for c in colour.values()), colour
    # the side ratio is uniform on [1, 4]: mean 2.5, standard deviation 3 / sqrt(12)
    mean = sum(sides) / len(sides)
    assert abs(mean - 2.5) <= 4.5 * (3 / math.sqrt(12)) / math.sqrt(len(sides))
    assert min(sides) < 1.3 and max(sides) > 3.7


def test_iou_crop_laws() -> None:
    """Crops keep 0.3-1 of each side, aspect 0.5-2, at least one box centre inside; the
    "leave as it is" option (1 of 7) ends at least a seventh of the draws."""
    crops = kept = 0
    for layout in _layouts(T.Compose([T.RandomIoUCrop()])):
        found = [op for op in layout.cols if op[0] == "crop"]
        if not found:
            kept += 1
            continue
        crops += 1
        width = found[0][2][1]
        height = next(op for op in layout.rows if op[0] == "crop")[2][1]
        assert int(160 * 0.3) <= width <= 160 and int(120 * 0.3) <= height <= 120
        assert 0.5 <= width / height <= 2.0
    assert crops + kept == DRAWS
    assert kept >= DRAWS / 7 - 4.5 * math.sqrt(DRAWS * (1 / 7) * (6 / 7))


def test_iou_crop_params_are_torchvisions_bit_for_bit() -> None:
    op = T.RandomIoUCrop()
    g = torch.Generator().manual_seed(1)
    for case in range(120):
        n = 1 + case % 10
        h, w = (int(v) for v in 100 + torch.randint(0, 2000, (2,), generator=g))
        xy = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.8
        wh = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.4 + 1
        boxes = tv_tensors.BoundingBoxes(
            torch.cat([xy, xy + wh], 1), format="XYXY", canvas_size=(h, w)
        )
        boxes = TF.convert_bounding_box_format(
            boxes, new_format=("XYXY", "XYWH", "CXCYWH")[case % 3]
        )
        torch.manual_seed(case)
        theirs, state = op.make_params([boxes]), torch.get_rng_state()
        torch.manual_seed(case)
        ours = iou_crop_params(op, h, w, boxes)
        assert torch.equal(torch.get_rng_state(), state)
        assert theirs.keys() == ours.keys()
        for key, value in theirs.items():
            same = (
                torch.equal(value, ours[key])
                if key == "is_within_crop_area"
                else value == ours[key]
            )
            assert same, (case, key)


def test_iou_crop_params_match_torchvision_where_most_trials_fail() -> None:
    # a few small boxes on a large canvas (the SSD preset's zoomed-out one): most trials miss
    # them or overlap them too little, whole options' trials fail and the loop draws again
    # (the trials' draws, taken as one block, are wound back to exactly what they took)
    op = T.RandomIoUCrop()
    g = torch.Generator().manual_seed(2)
    crops = 0
    for case in range(60):
        n = 1 + case % 3
        h, w = (int(v) for v in 1000 + torch.randint(0, 1000, (2,), generator=g))
        xy = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.9
        wh = torch.rand(n, 2, generator=g) * torch.tensor([w, h]) * 0.05 + 1
        boxes = tv_tensors.BoundingBoxes(torch.cat([xy, xy + wh], 1), format="XYXY",
                                         canvas_size=(h, w))  # fmt: skip
        torch.manual_seed(100 + case)
        theirs, state = op.make_params([boxes]), torch.get_rng_state()
        torch.manual_seed(100 + case)
        ours = iou_crop_params(op, h, w, boxes)
        assert torch.equal(torch.get_rng_state(), state), case
        assert theirs.keys() == ours.keys(), case
        for key, value in theirs.items():
            if key == "is_within_crop_area":
                assert torch.equal(value, ours[key]), case
            else:
                assert value == ours[key], (case, key)
        crops += bool(ours)
    assert 20 < crops < 60  # crops drawn, and options of 1.0 (no crop) among them
