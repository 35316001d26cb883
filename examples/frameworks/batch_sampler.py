"""A plain torch loop whose DataLoader takes a ``batch_sampler`` (so ``batch_size`` is None).

Frameworks hand their loaders batch samplers (accelerate's `DataLoaderShard`, bucketing
samplers); samples per second must then come from the batches themselves: 32 a batch
here, not 1. ``unstall run -- python examples/frameworks/batch_sampler.py``.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


class Points(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        label = index % 2
        return torch.randn(16, generator=g) + (1.0 if label else -1.0), label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = Points(args.samples)
    batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=False)
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            seen += len(y)
    print(f"trained {args.epochs} epochs, {seen} samples")


if __name__ == "__main__":
    main()
