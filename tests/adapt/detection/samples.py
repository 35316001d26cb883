"""Detection samples for the tests: images with structure, boxes in any format, presets."""

from __future__ import annotations

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2 as T
from torchvision.transforms.v2 import functional as TF

FILL = [123.0, 117.0, 104.0]


def sample(seed: int, h: int = 240, w: int = 320, n: int = 5, fmt: str = "XYXY"):
    """A smooth uint8 ``tv_tensors.Image`` (noise upsampled 8x: edges and flats) and a target
    of ``n`` boxes in ``fmt``, labels, an id: a function of the arguments only."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(1, 3, max(1, h // 8), max(1, w // 8), generator=g)
    img = torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear")[0]
    img = tv_tensors.Image((img * 255).round().to(torch.uint8))
    x0 = torch.rand(n, generator=g) * w * 0.7
    y0 = torch.rand(n, generator=g) * h * 0.7
    x1 = x0 + 4 + torch.rand(n, generator=g) * w * 0.3
    y1 = y0 + 4 + torch.rand(n, generator=g) * h * 0.3
    boxes = tv_tensors.BoundingBoxes(
        torch.stack([x0, y0, x1, y1], 1), format="XYXY", canvas_size=(h, w)
    )
    boxes = TF.convert_bounding_box_format(boxes, new_format=fmt)
    labels = torch.randint(1, 91, (n,), generator=g)
    return img, {"boxes": boxes, "labels": labels, "image_id": seed, "iscrowd": labels * 0}


def tail():
    return [T.ToDtype(torch.float32, scale=True), T.SanitizeBoundingBoxes()]


PRESETS = {
    "ssd": lambda: T.Compose(
        [
            T.RandomPhotometricDistort(),
            T.RandomZoomOut(fill=FILL),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(),
            T.Resize((160, 160)),
            *tail(),
        ]
    ),
    "ssdlite": lambda: T.Compose(
        [T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((160, 160)), *tail()]
    ),
    "hflip": lambda: T.Compose([T.RandomHorizontalFlip(), *tail()]),
    "reference_ssd": lambda: T.Compose(  # references/detection/presets.py, ssd, v2, tv_tensor
        [
            T.ToImage(),
            T.RandomPhotometricDistort(),
            T.RandomZoomOut(fill={tv_tensors.Image: FILL, "others": 0}),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(p=0.5),
            T.ToDtype(torch.float, scale=True),
            T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
            T.SanitizeBoundingBoxes(),
            T.ToPureTensor(),
        ]
    ),
    "multiscale": lambda: T.Compose(
        [
            T.RandomShortestSize(min_size=(96, 128, 160), max_size=260),
            T.RandomHorizontalFlip(),
            *tail(),
        ]
    ),
    "lsj": lambda: T.Compose(
        [
            T.ScaleJitter(target_size=(200, 200)),
            T.RandomVerticalFlip(),
            T.ClampBoundingBoxes(),
            *tail(),
        ]
    ),
}


def same_draws(dataset, planned, index: int, seed: int, tensors: tuple[str, ...]):
    """``dataset[index]`` and ``planned[index]`` from the same state of torch's generator:
    asserts the plan drew as many numbers and that each of the ``tensors`` keys of the
    targets is torchvision's (type, dtype, values: exact), and the others equal; returns
    both ``(image, target)`` pairs."""
    torch.manual_seed(seed)
    theirs = dataset[index]
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    ours = planned[index]
    assert torch.equal(torch.get_rng_state(), state), (seed, index)  # no more, no fewer
    (_, a), (_, b) = theirs, ours
    assert a.keys() == b.keys(), (seed, index)
    for key in a:
        if key in tensors:
            assert type(a[key]) is type(b[key]) and a[key].dtype == b[key].dtype, (key, seed)
            assert torch.equal(a[key], b[key]), (key, seed, index)
        else:
            assert a[key] == b[key], (key, seed, index)
    return theirs, ours
