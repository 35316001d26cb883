"""torchvision's ``CocoDetection`` wrapped with ``wrap_dataset_for_transforms_v2`` (boxes,
labels, polygon masks, image ids), given the SSD reference preset as ``transforms=``: found,
planned, and its targets exactly torchvision's for the same draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image
from torchvision.transforms import v2 as T

import unstall
from tests.adapt.detection.samples import PRESETS, same_draws
from unstall.adapt.detection import DetectionPlan, PlannedDetection, find_detection
from unstall.adapt.recognize import Refusal

pytest.importorskip("pycocotools")
#: pycocotools 2.0.11's mask decode under numpy 2 (not ours), once per polygon
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

#: image ids as COCO has them: not the dataset's indices
IDS = [139, 285, 632, 724]
KEYS = ("boxes", "labels", "masks", "image_id", "iscrowd")
COLOUR_TOLERANCE = (2.0, 40.0)  # test_detection_plan.py's: mean and worst grey levels


def ssd(resize: bool) -> T.Compose:
    """references/detection/presets.py's "ssd" (samples.py's ``reference_ssd``: masks
    padded with 0, the image with the mean); with a ``Resize`` after the flip as the
    issue's script has."""
    ops = list(PRESETS["reference_ssd"]().transforms)
    if resize:
        ops.insert(5, T.Resize((64, 64)))
    return T.Compose(ops)


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> tuple[Path, Path]:
    """Four JPEGs of 96x72 (a gradient, a colour per image) and instances.json: 2-5 objects
    each, a distinct category per object of an image (the labels name the kept indices), a
    box and a polygon (a diamond inside the box) per object."""
    root = tmp_path_factory.mktemp("coco")
    g = torch.Generator().manual_seed(59)
    images, annotations = [], []
    for k, image_id in enumerate(IDS):
        y, x = torch.meshgrid(torch.linspace(0, 1, 72), torch.linspace(0, 1, 96), indexing="ij")
        x, y = x[:, :, None], y[:, :, None]
        rgb = torch.cat([x * 200 + 30 * k, y * 180, (x + y) * 60 + 20], 2).clamp(0, 255)
        Image.fromarray(rgb.byte().numpy()).save(root / f"{image_id:012d}.jpg", quality=92)
        images.append(
            {"id": image_id, "file_name": f"{image_id:012d}.jpg", "height": 72, "width": 96}
        )
        for n in range(2 + k):
            bx, by = (
                float(torch.randint(0, 60, (1,), generator=g)),
                float(torch.randint(0, 40, (1,), generator=g)),
            )
            bw, bh = (
                8.0 + float(torch.randint(0, 28, (1,), generator=g)),
                8.0 + float(torch.randint(0, 24, (1,), generator=g)),
            )
            cx, cy = bx + bw / 2, by + bh / 2
            diamond = [cx, by, bx + bw, cy, cx, by + bh, bx, cy]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": 10 * (n + 1) + k,
                    "bbox": [bx, by, bw, bh],
                    "area": bw * bh / 2,
                    "iscrowd": 0,
                    "segmentation": [diamond],
                }
            )
    categories = [
        {"id": c, "name": f"c{c}"} for c in sorted({a["category_id"] for a in annotations})
    ]
    instances = root / "instances.json"
    instances.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return root, instances


def wrapped(coco: tuple[Path, Path], resize: bool = False):
    root, instances = coco
    base = torchvision.datasets.CocoDetection(str(root), str(instances), transforms=ssd(resize))
    return torchvision.datasets.wrap_dataset_for_transforms_v2(base, target_keys=KEYS)


def planned(dataset) -> PlannedDetection:
    found = find_detection(dataset)
    assert found is not None and not isinstance(found, Refusal), found
    return PlannedDetection(
        dataset, found.owner, found.attr, DetectionPlan(found.steps), found.name
    )


def test_wrapped_coco_is_found_with_its_pipeline(coco) -> None:
    dataset = wrapped(coco)
    found = find_detection(torch.utils.data.Subset(dataset, [2, 0]))
    assert found is not None and not isinstance(found, Refusal), found
    assert found.name == "Subset(CocoDetection)" and found.attr == "transforms"
    assert found.owner is dataset
    assert [s.name for s in found.steps] == [type(op).__name__ for op in ssd(False).transforms]
    _image, target = dataset[1]  # the wrapper's own output: what the plan must match
    assert set(target) == set(KEYS) and target["image_id"] == IDS[1]
    assert type(target["masks"]) is torch.Tensor  # ToPureTensor: masks out as plain tensors


@pytest.mark.parametrize("resize", [False, True], ids=["reference", "resize"])
def test_targets_are_torchvisions_for_the_same_draws(coco, resize: bool) -> None:
    """Boxes, labels (hence kept indices), masks, image ids and the other keys equal, exact;
    the same number of draws from torch's generator; pixels within the plan's tolerance."""
    dataset = wrapped(coco, resize)
    plan = planned(dataset)
    kept_some = dropped_some = painted = False
    means = []
    for seed in range(6):
        for index in range(len(IDS)):
            theirs, ours = same_draws(dataset, plan, index, seed, ("boxes", "labels", "masks"))
            (img_a, _), (img_b, tgt_b) = theirs, ours
            assert tgt_b.keys() == set(KEYS) and tgt_b["image_id"] == IDS[index]
            labels = tgt_b["labels"].tolist()
            originals = [10 * (n + 1) + index for n in range(2 + index)]
            kept = [originals.index(label) for label in labels]
            assert kept == sorted(kept)  # the kept indices, in order
            kept_some |= bool(kept)
            dropped_some |= len(kept) < len(originals)
            masks = tgt_b["masks"]
            assert masks.shape == (len(labels), *img_b.shape[-2:])
            assert masks.dtype == torch.uint8 and set(masks.unique().tolist()) <= {0, 1}
            painted |= bool(masks.any())
            assert img_a.shape == img_b.shape and img_a.dtype == img_b.dtype == torch.float32
            diff = (img_a - img_b).abs() * 255
            assert float(diff.max()) <= COLOUR_TOLERANCE[1], (seed, index, float(diff.max()))
            means.append(float(diff.mean()))
    assert kept_some and dropped_some  # the draws crop some objects away, keep others
    assert painted  # the polygons' pixels reach the output
    assert sum(means) / len(means) <= COLOUR_TOLERANCE[0]


def _collate(batch):
    return tuple(zip(*batch, strict=True))


def test_wrapped_coco_under_lean_keeps_masks_and_each_image_once(coco, capsys) -> None:
    dataset = wrapped(coco, resize=True)
    loader = unstall.DataLoader(
        dataset, batch_size=3, shuffle=True, num_workers=2, collate_fn=_collate, prep="lean"
    )
    assert "CocoDetection detection pipeline planned" in capsys.readouterr().err
    assert isinstance(loader.dataset, PlannedDetection)
    ids = []
    for images, targets in loader:
        for image, target in zip(images, targets, strict=True):
            assert image.shape == (3, 64, 64)
            assert target["masks"].shape == (len(target["labels"]), 64, 64)
            assert target["boxes"].shape == (len(target["labels"]), 4)
            ids.append(target["image_id"])
    assert sorted(ids) == IDS
    assert type(dataset.transforms).__name__ == "Compose"  # the script's, put back
