"""Decodes deferred to the plan: a reduced DCT scale where the output allows it, the
script's own decode (bit-identical) where it does not, and a decoded image the script
reworks before its pipeline decoded in full instead."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.io import decode_jpeg
from torchvision.transforms import v2 as T

import unstall.adapt.detection.plan as plan_module
from tests.adapt.detection.samples import sample
from unstall.adapt.detection import adapt_detection

BOXES = [[20.0, 30.0, 200.0, 150.0], [100.0, 10.0, 300.0, 230.0]]


def _jpeg(seed: int) -> bytes:
    image, _ = sample(seed, h=240, w=320)
    out = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(out, "JPEG", quality=95)
    return out.getvalue()


class Files(torch.utils.data.Dataset):
    """JPEG bytes in memory, decoded by ``torchvision.io.decode_jpeg`` in ``__getitem__``;
    ``rework``: the script converts the decoded image before its pipeline."""

    def __init__(self, transforms, rework: bool = False):
        self.files = [_jpeg(k) for k in range(4)]
        self.transforms, self.rework = transforms, rework

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        image = decode_jpeg(torch.frombuffer(bytearray(self.files[index]), dtype=torch.uint8))
        if self.rework:
            image = image.float() / 255
        boxes = tv_tensors.BoundingBoxes(BOXES, format="XYXY", canvas_size=(240, 320))
        return self.transforms(image, {"boxes": boxes, "labels": torch.tensor([1, 2])})


@pytest.fixture
def scales(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = plan_module.decode_jpeg

    def spy(data, *, scale=1):
        seen.append(scale)
        return real(data, scale=scale)

    monkeypatch.setattr(plan_module, "decode_jpeg", spy)
    return seen


def _pair(dataset, index: int, seed: int):
    planned = adapt_detection(dataset, "lean", lambda line: None)
    torch.manual_seed(seed)
    ours = planned[index]
    torch.manual_seed(seed)
    theirs = dataset[index]
    return planned, ours, theirs


def test_small_output_decodes_at_a_reduced_scale(scales) -> None:
    dataset = Files(T.Compose([T.RandomHorizontalFlip(), T.Resize((60, 80))]))
    for index in range(4):
        _, (a, ta), (b, tb) = _pair(dataset, index, seed=index)
        assert torch.equal(ta["boxes"], tb["boxes"])
        d = (a.float() - b.float()).abs()
        assert float(d.mean()) <= 3.5 and float(d.max()) <= 24.0, (d.mean(), d.max())
    assert scales == [4, 4, 4, 4]  # 240x320 -> 60x80: a decoded pixel per output pixel at 1/4


def test_full_size_output_uses_the_scripts_own_decode(scales) -> None:
    dataset = Files(T.Compose([T.RandomZoomOut(p=1.0), T.RandomHorizontalFlip()]))
    for index in range(4):
        planned, (a, ta), (b, tb) = _pair(dataset, index, seed=index)
        assert planned is not dataset  # planned (a zoom-out to fold), not left as it is
        assert torch.equal(a, b) and torch.equal(ta["boxes"], tb["boxes"])
    assert scales == []  # never simplejpeg: torchvision's decode, bit-identical


def test_a_reworked_image_is_decoded_in_full(scales) -> None:
    dataset = Files(T.Compose([T.RandomIoUCrop(), T.Resize((60, 80))]), rework=True)
    planned, (a, ta), (b, tb) = _pair(dataset, 1, seed=5)
    assert planned.defer is False  # and stays off for the next samples
    assert torch.equal(ta["boxes"], tb["boxes"]) and a.dtype == b.dtype == torch.float32
    assert float((a - b).abs().max()) <= 2 / 255
    assert scales == []
