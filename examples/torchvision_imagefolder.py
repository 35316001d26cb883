"""The usual torchvision image-training script, with nothing of unstall in it.

pytorch/examples' ``imagenet/main.py`` data path: ``torchvision.datasets.ImageFolder`` with
``RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize``, float32 batches made by
the CPU workers, ``.to(device, non_blocking=True)`` in the loop. The model is simulated:
each step holds the batch for ``--step-ms`` (or runs a tiny net with ``--step-ms 0``).

Run it as it is, or unchanged under unstall with a config (``unstall analyze`` writes one):
``unstall run --config prep.json -- python examples/torchvision_imagefolder.py DATA``, with
``prep.json`` = ``{"kwargs": {"prep": "lean"}}``. ``--ids FILE`` writes, per epoch, each
batch's sample ids (the file names' numbers) and labels as JSON lines (for the tests);
``--stop-after N`` / ``--resume CKPT`` save and load the loader's position when it has one.
"""

import argparse
import json
import os
import time

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step time")
    parser.add_argument("--ids", default=None, help="write each batch's ids and labels here")
    parser.add_argument("--stop-after", type=int, default=None, help="batches, then save")
    parser.add_argument("--resume", default=None, help="a checkpoint --stop-after wrote")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(args.data, transform=train_tf)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
        drop_last=False,
    )
    model = nn.Sequential(
        nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 64, len(dataset.classes))
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start_epoch = 0
    if args.resume and hasattr(loader, "load_state_dict"):
        ckpt = torch.load(args.resume)
        loader.load_state_dict(ckpt["loader"])
        start_epoch = ckpt["epoch"]
    ids = open(args.ids, "a") if args.ids else None  # noqa: SIM115 (closed at exit)
    done, samples, t0 = 0, 0, time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        for images, target in loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            if ids is not None:
                ids.write(json.dumps(_record(epoch, images, target, loader, done)) + "\n")
            if args.step_ms > 0:
                time.sleep(args.step_ms / 1000)  # the simulated model's step
            else:
                opt.zero_grad()
                nn.functional.cross_entropy(model(images), target).backward()
                opt.step()
            done += 1
            samples += len(target)
            if args.stop_after is not None and done == args.stop_after:
                state = loader.state_dict() if hasattr(loader, "state_dict") else None
                torch.save({"loader": state, "epoch": epoch}, args.ids + ".ckpt")
                return
    seconds = time.perf_counter() - t0
    print(f"samples/s: {samples / seconds:.1f} ({samples} samples in {seconds:.2f} s)")


def _record(epoch, images, target, loader, done):
    return {
        "epoch": epoch,
        "dtype": str(images.dtype),
        "shape": list(images.shape),
        "min": float(images.min()),
        "max": float(images.max()),
        "corner": images[:, :, 0, 0].tolist(),  # each image's top-left pixel, per channel
        "labels": target.tolist(),
        "loader": type(loader).__module__,
        "batch": done,
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    main()
