"""An SSD-style torchvision detection training script, with nothing of unstall in it.

Shaped like torchvision's detection reference (``references/detection``, the "ssd" preset):
a Dataset of JPEG files read with ``torchvision.io.decode_jpeg(read_file(path))`` and their
boxes as ``tv_tensors.BoundingBoxes`` (``DATA/annotations.json``: ``{"images": [{"file",
"boxes" (XYXY), "labels"}]}``), a ``transforms.v2`` pipeline (``--preset``: ``ssd`` =
``RandomPhotometricDistort + RandomZoomOut(fill=mean) + RandomIoUCrop + RandomHorizontalFlip
+ Resize((300, 300))``, ``ssdlite`` = ``RandomIoUCrop + RandomHorizontalFlip + Resize``,
``hflip`` = Faster R-CNN's ``RandomHorizontalFlip`` alone; each then ``ToDtype(float32,
scale=True) + SanitizeBoundingBoxes``), a list collate, 2 workers. The model is simulated:
each step holds the batch for ``--step-ms``.

Run it as it is, or unchanged under unstall: ``unstall run --config lean.json -- python
examples/detection_ssd.py DATA`` with ``lean.json`` = ``{"kwargs": {"prep": "lean"}}``.
``--ids FILE`` writes each batch as JSON lines (for the tests); ``--stop-after N`` /
``--resume CKPT`` save and load the loader's position when it has one.
"""

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2 as T

MEAN = (123.0, 117.0, 104.0)


class JpegBoxes(Dataset):
    """JPEG files and their boxes, as the reference's COCO dataset gives them."""

    def __init__(self, root, transforms=None):
        with open(os.path.join(root, "annotations.json")) as f:
            self.items = json.load(f)["images"]
        self.root = root
        self.transforms = transforms

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        item = self.items[index]
        image = decode_jpeg(read_file(os.path.join(self.root, item["file"])))
        image = tv_tensors.Image(image)
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.tensor(item["boxes"], dtype=torch.float32),
                format="XYXY",
                canvas_size=tuple(image.shape[-2:]),
            ),
            "labels": torch.tensor(item["labels"], dtype=torch.int64),
            "image_id": index,
        }
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def preset(name, size):
    if name == "ssd":
        ops = [
            T.RandomPhotometricDistort(),
            T.RandomZoomOut(fill=list(MEAN)),
            T.RandomIoUCrop(),
            T.RandomHorizontalFlip(),
            T.Resize((size, size)),
        ]
    elif name == "ssdlite":
        ops = [T.RandomIoUCrop(), T.RandomHorizontalFlip(), T.Resize((size, size))]
    else:
        ops = [T.RandomHorizontalFlip()]
    return T.Compose([*ops, T.ToDtype(torch.float32, scale=True), T.SanitizeBoundingBoxes()])


def collate(batch):
    return tuple(zip(*batch, strict=True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--preset", default="ssd", choices=("ssd", "ssdlite", "hflip"))
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step time")
    parser.add_argument("--ids", default=None, help="write each batch's samples here")
    parser.add_argument("--stop-after", type=int, default=None, help="batches, then save")
    parser.add_argument("--resume", default=None, help="a checkpoint --stop-after wrote")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dataset = JpegBoxes(args.data, transforms=preset(args.preset, args.size))
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        collate_fn=collate,
    )
    start_epoch = 0
    if args.resume and hasattr(loader, "load_state_dict"):
        ckpt = torch.load(args.resume)
        loader.load_state_dict(ckpt["loader"])
        start_epoch = ckpt["epoch"]
    ids = open(args.ids, "a") if args.ids else None  # noqa: SIM115 (closed at exit)
    done, samples, t0 = 0, 0, time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        for images, targets in loader:
            if ids is not None:
                ids.write(json.dumps(_record(epoch, images, targets, loader)) + "\n")
            if args.step_ms > 0:
                time.sleep(args.step_ms / 1000)  # the simulated model's step
            done += 1
            samples += len(images)
            if args.stop_after is not None and done == args.stop_after:
                state = loader.state_dict() if hasattr(loader, "state_dict") else None
                torch.save({"loader": state, "epoch": epoch}, args.ids + ".ckpt")
                return
    seconds = time.perf_counter() - t0
    print(f"samples/s: {samples / seconds:.1f} ({samples} samples in {seconds:.2f} s)")


def _record(epoch, images, targets, loader):
    return {
        "epoch": epoch,
        "loader": type(loader).__module__,
        "samples": [
            {
                "id": t["image_id"],
                "image": [type(i).__name__, str(i.dtype), list(i.shape)],
                "pixel_sum": round(float(i.double().sum()), 3),
                "boxes_type": type(t["boxes"]).__name__,
                "boxes": t["boxes"].tolist(),
                "canvas": list(t["boxes"].canvas_size),
                "labels": t["labels"].tolist(),
            }
            for i, t in zip(images, targets, strict=True)
        ],
    }


if __name__ == "__main__":
    main()
