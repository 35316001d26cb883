"""An unedited training script whose batches are large to receive (nothing of unstall in it).

Each sample is made, not read: a float32 image of 3x300x300 (1 MB) filled from its index,
cheap to make, so much of what the training process pays per batch is taking it from the
workers. The "model" runs at ``--rate`` samples/s, sleeping.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return torch.full((3, 300, 300), float(index)), index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=4000.0)
    args = parser.parse_args()
    loader = DataLoader(Images(args.samples), batch_size=args.batch_size, num_workers=args.workers)
    seen = 0
    for _ in range(args.epochs):
        for images, _labels in loader:
            time.sleep(len(images) / args.rate)
            seen += len(images)
    print(f"samples {seen}")


if __name__ == "__main__":
    main()
