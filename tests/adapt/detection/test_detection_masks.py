"""Masks in a script's own Dataset target: a ``tv_tensors.Mask`` per box beside the
``BoundingBoxes``, carried through every preset and equal to torchvision's for the same
draws (torchvision's ops applied to them with the params unstall drew)."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2 as T

from tests.adapt.detection.samples import FILL, PRESETS, same_draws, sample, tail
from unstall.adapt.detection import DetectionPlan, PlannedDetection, find_detection, read_steps
from unstall.adapt.recognize import Refusal


def ssd_masks() -> T.Compose:
    """The "ssd" preset with the fill torchvision needs for masks (a list fill raises on a
    Mask in torchvision itself: "Non-scalar fill value is not supported")."""
    fill = {tv_tensors.Image: FILL, tv_tensors.Mask: 0}
    return T.Compose(
        [
            T.RandomPhotometricDistort(),
            T.RandomZoomOut(fill=fill),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(),
            T.Resize((96, 96)),
            *tail(),
        ]
    )


#: every preset of samples.py that torchvision runs on masks, "ssd" with its mask fill
MASK_PRESETS = {**{k: v for k, v in PRESETS.items() if k != "ssd"}, "ssd": ssd_masks}


class Shapes(torch.utils.data.Dataset):
    """A script's own dataset: an image, its boxes, one mask per box (the box's pixels, a
    corner cut off: not a box again), labels; ``self.transforms(image, target)``."""

    def __init__(self, transforms, n: int = 4):
        self.transforms, self.n = transforms, n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        image, target = sample(100 + index, h=120, w=160, n=2 + index)
        boxes = target["boxes"].round().int().tolist()
        masks = torch.zeros((len(boxes), 120, 160), dtype=torch.uint8)
        for mask, (x0, y0, x1, y1) in zip(masks, boxes, strict=True):
            mask[y0:y1, x0:x1] = 1
            mask[y0 : (y0 + y1) // 2, x0 : (x0 + x1) // 2] = 0
        target["masks"] = tv_tensors.Mask(masks)
        return self.transforms(image, target)


@pytest.mark.parametrize("preset", sorted(MASK_PRESETS))
def test_masks_are_torchvisions_for_the_same_draws(preset: str) -> None:
    dataset = Shapes(MASK_PRESETS[preset]())
    steps = read_steps(dataset.transforms)  # the plan (find_detection may leave a flip alone)
    assert not isinstance(steps, Refusal), steps
    planned = PlannedDetection(dataset, dataset, "transforms", DetectionPlan(steps), preset)
    painted = 0
    keys = ("boxes", "labels", "masks", "iscrowd")
    for seed in range(3):
        for index in range(len(dataset)):
            _theirs, (img_b, tgt_b) = same_draws(dataset, planned, index, seed, keys)
            assert tgt_b["image_id"] == 100 + index
            masks = tgt_b["masks"]
            if preset != "reference_ssd":  # it ends on ToPureTensor
                assert type(masks) is tv_tensors.Mask
            assert masks.shape == (len(tgt_b["labels"]), *img_b.shape[-2:])
            painted += int(masks.sum())
    assert painted > 0  # the masks' pixels reach the output


def test_a_mask_beside_the_boxes_is_found_and_planned() -> None:
    found = find_detection(Shapes(ssd_masks()))
    assert found is not None and not isinstance(found, Refusal), found
    assert found.name == "Shapes" and found.attr == "transforms"
