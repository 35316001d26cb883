"""An unedited torchvision-style training script with a validation pass each epoch (nothing of
unstall in it).

It trains on ``ROOT/train`` (``RandomResizedCrop``: a random augmentation) and evaluates on
``ROOT/val`` after each epoch (``Resize(256) + CenterCrop(224) + ToTensor + Normalize``:
deterministic), each an ``ImageFolder`` with its own DataLoader. ``--draw`` gives the
validation dataset a hidden draw (``random.random()`` in ``__getitem__``), as a dataset
with an augmentation of its own would. The "model" sleeps ``--step-ms`` per training batch
and ``--eval-ms`` per validation batch.
"""

import argparse
import random
import time

from torch.utils.data import DataLoader
from torchvision import datasets, transforms

NORMALIZE = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


class DrawingFolder(datasets.ImageFolder):
    """An image folder whose samples carry a hidden draw."""

    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image * (1.0 + 0.01 * random.random()), label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--eval-ms", type=float, default=5.0)
    parser.add_argument("--draw", action="store_true")
    args = parser.parse_args()
    train_tf = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.ToTensor(), NORMALIZE]
    )
    val_tf = transforms.Compose(
        [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), NORMALIZE]
    )
    folder = DrawingFolder if args.draw else datasets.ImageFolder
    train = datasets.ImageFolder(f"{args.root}/train", train_tf)
    val = folder(f"{args.root}/val", val_tf)
    train_loader = DataLoader(
        train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    val_loader = DataLoader(val, batch_size=args.batch_size, num_workers=args.workers)
    seen = evaluated = 0
    for _ in range(args.epochs):
        for images, _labels in train_loader:
            time.sleep(args.step_ms / 1e3)
            seen += len(images)
        for images, _labels in val_loader:
            time.sleep(args.eval_ms / 1e3)
            evaluated += len(images)
    print(f"trained {seen} evaluated {evaluated}")


if __name__ == "__main__":
    main()
