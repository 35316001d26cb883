"""Where the pipeline sits: the script's own Dataset class, torchvision's wrapped VOC, Subsets;
an op unstall does not plan leaves the pipeline as it is, with one line saying which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image
from torchvision import tv_tensors
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import functional as F1
from torchvision.transforms import v2 as T

import unstall
from tests.adapt.detection.samples import FILL
from unstall.adapt.detection import PlannedDetection, find_detection
from unstall.adapt.recognize import Refusal

SSD = [
    T.RandomPhotometricDistort(),
    T.RandomZoomOut(fill=FILL),
    T.RandomIoUCrop(),
    T.RandomHorizontalFlip(),
    T.Resize((48, 48)),
    T.ToDtype(torch.float32, scale=True),
    T.SanitizeBoundingBoxes(),
]
N = 20


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    """N JPEGs of 80x60, image k's colour encodes k; one box a third of the image each."""
    root = tmp_path_factory.mktemp("det")
    items = []
    for k in range(N):
        Image.new("RGB", (80, 60), (10 * k, 200 - 5 * k, 90)).save(root / f"{k}.jpg", quality=95)
        items.append({"file": f"{k}.jpg", "boxes": [[10, 10, 50, 40]], "labels": [k + 1]})
    (root / "annotations.json").write_text(json.dumps({"images": items}))
    return root


class Boxes(torch.utils.data.Dataset):
    """A script's own dataset: decode_jpeg(read_file(...)), self.transforms(image, target)."""

    def __init__(self, root: Path, transforms):
        self.root, self.transforms = root, transforms
        self.items = json.loads((root / "annotations.json").read_text())["images"]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        item = self.items[index]
        image = decode_jpeg(read_file(str(self.root / item["file"])))
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.tensor(item["boxes"], dtype=torch.float32),
                format="XYXY",
                canvas_size=tuple(image.shape[-2:]),
            ),
            "labels": torch.tensor(item["labels"]),
            "image_id": index,
        }
        image, target = self.transforms(image, target)
        return image, target


def _collate(batch):
    return tuple(zip(*batch, strict=True))


def test_own_dataset_under_lean_keeps_types_and_each_sample_once(jpegs, capsys) -> None:
    dataset = Boxes(jpegs, T.Compose(SSD))
    loader = unstall.DataLoader(
        dataset, batch_size=6, shuffle=True, num_workers=2, collate_fn=_collate, prep="lean"
    )
    assert "Boxes detection pipeline planned" in capsys.readouterr().err
    assert isinstance(loader.dataset, PlannedDetection)
    for _ in range(2):
        ids = []
        for images, targets in loader:
            assert isinstance(images, tuple) and isinstance(targets, tuple)
            for image, target in zip(images, targets, strict=True):
                assert type(image) is torch.Tensor and image.dtype == torch.float32
                assert image.shape == (3, 48, 48)
                assert isinstance(target["boxes"], tv_tensors.BoundingBoxes)
                assert target["boxes"].canvas_size == (48, 48)
                assert target["labels"].tolist() in ([], [target["image_id"] + 1])
                ids.append(target["image_id"])
        assert sorted(ids) == list(range(N))
    assert dataset.transforms.__class__.__name__ == "Compose"  # the script's, put back


def test_wrapped_voc_is_planned(tmp_path) -> None:
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True)
    names = [f"img{k}" for k in range(4)]
    for k, name in enumerate(names):
        Image.new("RGB", (64, 48), (40 * k, 80, 120)).save(voc / "JPEGImages" / f"{name}.jpg")
        (voc / "Annotations" / f"{name}.xml").write_text(
            f"<annotation><filename>{name}.jpg</filename><size><width>64</width>"
            "<height>48</height><depth>3</depth></size><object><name>dog</name>"
            "<bndbox><xmin>5</xmin><ymin>6</ymin><xmax>40</xmax><ymax>30</ymax></bndbox>"
            "</object></annotation>"
        )
    (voc / "ImageSets" / "Main" / "train.txt").write_text("\n".join(names) + "\n")
    base = torchvision.datasets.VOCDetection(str(tmp_path), year="2012", image_set="train")
    pipeline = T.Compose([T.ToImage(), T.RandomIoUCrop(), T.RandomHorizontalFlip(), *SSD[4:]])
    wrapped = torchvision.datasets.wrap_dataset_for_transforms_v2(base)
    wrapped.transforms = pipeline
    found = find_detection(torch.utils.data.Subset(wrapped, [3, 1]))
    assert not isinstance(found, Refusal) and found is not None
    assert found.name == "Subset(VOCDetection)" and found.attr == "transforms"
    loader = unstall.DataLoader(
        torch.utils.data.Subset(wrapped, [3, 1]), batch_size=2, collate_fn=_collate, prep="lean"
    )
    images, targets = next(iter(loader))
    assert [i.shape for i in images] == [(3, 48, 48)] * 2
    assert all(isinstance(t["boxes"], tv_tensors.BoundingBoxes) for t in targets)
    reds = [float(i[0].mul(255).median()) for i in images]
    assert abs(reds[0] - 120) <= 3 and abs(reds[1] - 40) <= 3  # images 3 and 1: red 40 * k


class Blur(T.Transform):
    """An op of the script's own (a v2 Transform subclass outside torchvision)."""

    def transform(self, inpt, params):
        return inpt


def test_unknown_op_leaves_the_pipeline_as_it_is_with_its_line(jpegs, capsys) -> None:
    dataset = Boxes(jpegs, T.Compose([T.RandomHorizontalFlip(), Blur(), *SSD[4:]]))
    loader = unstall.DataLoader(dataset, batch_size=4, collate_fn=_collate, prep="lean")
    err = capsys.readouterr().err
    line = "unstall: prep='lean': detection pipeline left as it is: transform"
    assert line in err and "Blur is not torchvision's" in err
    assert err.count("unstall: prep=") == 1
    assert loader.dataset is dataset
    _images, targets = next(iter(loader))
    assert [t["image_id"] for t in targets] == [0, 1, 2, 3]


def test_nothing_to_fold_leaves_the_pipeline_as_it_is_with_its_line(jpegs, capsys) -> None:
    """A flip alone (Faster R-CNN's hflip preset), colours or type ops: a plan would do the
    same work plus its own (0.80x end to end on the hflip preset), so the dataset is run as
    it is, and the one line says why."""
    for ops in ([T.RandomHorizontalFlip()], [T.RandomPhotometricDistort(), T.RandomVerticalFlip()]):
        dataset = Boxes(jpegs, T.Compose([*ops, *SSD[5:]]))
        loader = unstall.DataLoader(dataset, batch_size=4, collate_fn=_collate, prep="lean")
        err = capsys.readouterr().err
        assert err.count("unstall: prep=") == 1
        assert (
            "unstall: prep='lean': detection pipeline left as it is: nothing to fold (no "
            "zoom-out, IoU crop or resize to plan): a plan would cost more than the pipeline "
            "as it is"
        ) in err
        assert loader.dataset is dataset
    for folded in (T.RandomZoomOut(fill=FILL), T.RandomIoUCrop(), T.Resize(32)):
        found = find_detection(Boxes(jpegs, T.Compose([folded, T.RandomHorizontalFlip()])))
        assert found is not None and not isinstance(found, Refusal), (folded, found)


def test_refusals_name_what_is_not_planned(jpegs) -> None:
    cases = {
        "ElasticTransform is not one unstall plans": [T.ElasticTransform()],
        "interpolation=nearest": [T.Resize(32, interpolation=T.InterpolationMode.NEAREST)],
        "antialias=False": [T.Resize(32, antialias=False)],
        "between geometric ops": [T.RandomIoUCrop(), T.RandomPhotometricDistort(), T.Resize(9)],
        "a torchvision v1 op": [torchvision.transforms.RandomHorizontalFlip()],
    }
    for words, ops in cases.items():
        found = find_detection(Boxes(jpegs, T.Compose(ops)))
        assert isinstance(found, Refusal) and words in found.reason, (words, found)
    image_folder = torchvision.datasets.ImageFolder
    assert find_detection(list(range(3))) is None
    assert image_folder is not None  # an ImageFolder is the classification recognizer's


class FixedSizeCrop(torch.nn.Module):
    """torchvision's references/detection/transforms.py ``FixedSizeCrop`` as users copy it
    (torchvision's transforms.v2 has no op of that name): a random crop to at most
    ``size``, then padding at the bottom and right up to it, boxes moved and filtered."""

    def __init__(self, size: tuple[int, int], fill: int = 0):
        super().__init__()
        self.crop_height, self.crop_width = size
        self.fill = fill

    def forward(self, img, target=None):
        _, height, width = F1.get_dimensions(img)
        new_height, new_width = min(height, self.crop_height), min(width, self.crop_width)
        if new_height != height or new_width != width:
            r = torch.rand(1)
            top = int(max(height - self.crop_height, 0) * r)
            left = int(max(width - self.crop_width, 0) * r)
            img = F1.crop(img, top, left, new_height, new_width)
            boxes = target["boxes"]
            boxes[:, 0::2] -= left
            boxes[:, 1::2] -= top
            boxes[:, 0::2].clamp_(min=0, max=new_width)
            boxes[:, 1::2].clamp_(min=0, max=new_height)
            valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            target["boxes"], target["labels"] = boxes[valid], target["labels"][valid]
        pad_bottom = max(self.crop_height - new_height, 0)
        pad_right = max(self.crop_width - new_width, 0)
        if pad_bottom or pad_right:
            img = F1.pad(img, [0, 0, pad_right, pad_bottom], self.fill, "constant")
        return img, target


def test_fixed_size_crop_from_the_references_is_left_as_it_is(jpegs, capsys) -> None:
    """An op named FixedSizeCrop is the script's own class (copied from torchvision's
    references): not planned, the pipeline left as it is, one line naming it; it runs."""
    ops = [T.RandomHorizontalFlip(), FixedSizeCrop((72, 64)), T.ToDtype(torch.float32, scale=True)]
    dataset = Boxes(jpegs, T.Compose(ops))
    found = find_detection(dataset)
    assert isinstance(found, Refusal)
    assert found.reason == (
        "transform FixedSizeCrop is not torchvision's (unstall plans transforms.v2)"
    )
    loader = unstall.DataLoader(dataset, batch_size=5, collate_fn=_collate, prep="lean")
    err = capsys.readouterr().err
    assert err.count("unstall: prep=") == 1
    assert f"detection pipeline left as it is: {found.reason}" in err
    assert loader.dataset is dataset
    images, targets = next(iter(loader))
    assert [t["image_id"] for t in targets] == [0, 1, 2, 3, 4]
    for image, target in zip(images, targets, strict=True):
        assert image.shape == (3, 72, 64)  # cropped 80 -> 64 wide, padded 60 -> 72 high
        assert bool((image[:, 60:] == 0).all())  # the references' padding, fill 0
        assert float(target["boxes"][:, 0::2].max()) <= 64
