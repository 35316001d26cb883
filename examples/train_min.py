"""A minimal PyTorch training script, with nothing of unstall in it.

Run it as it is (``python examples/train_min.py``), or under unstall, unchanged:
``unstall run -- python examples/train_min.py`` (swaps in unstall's DataLoader and
reports the stalls), ``unstall analyze -- python examples/train_min.py``.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Shapes(Dataset):
    """Small synthetic images: a noisy square or a noisy cross, made on the fly."""

    def __init__(self, n: int, size: int = 32):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        label = index % 2
        image = torch.rand(3, self.size, self.size, generator=g) * 0.3
        mid, r = self.size // 2, self.size // 4
        if label:
            image[:, mid - 2 : mid + 2, :] += 0.7
            image[:, :, mid - 2 : mid + 2] += 0.7
        else:
            image[:, mid - r : mid + r, mid - r : mid + r] += 0.7
        time.sleep(0.0005)  # a little I/O, as reading a file would take
        return image, label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Shapes(args.samples), batch_size=64, shuffle=True, num_workers=args.workers)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(128, 2),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        total, correct = 0.0, 0
        for images, labels in loader:
            opt.zero_grad()
            out = model(images)
            loss = nn.functional.cross_entropy(out, labels)
            loss.backward()
            opt.step()
            total += loss.item() * len(labels)
            correct += int((out.argmax(1) == labels).sum())
        n = len(loader.dataset)
        print(f"epoch {epoch}: loss {total / n:.3f}, accuracy {correct / n:.2f}")


if __name__ == "__main__":
    main()
