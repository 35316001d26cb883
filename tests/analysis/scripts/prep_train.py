"""An unedited training script whose Dataset opens its own files and prepares each sample
deterministically at a known CPU cost (nothing of unstall in it).

``__getitem__`` reads ``paths[i]``, spends ``--cpu-ms`` of CPU, and returns a float tensor of
the file's bytes with its label; ``--draw`` adds a hidden draw (``random.random()``), as an
augmentation of its own would. The "model" runs at ``--rate`` samples/s, sleeping.
"""

import argparse
import os
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Clips(Dataset):
    def __init__(self, root: str, cpu_s: float, draw: bool):
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))
        self.cpu_s, self.draw = cpu_s, draw

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with open(self.paths[index], "rb") as f:
            data = f.read()
        end = time.thread_time() + self.cpu_s
        x = 0
        while time.thread_time() < end:
            x += 1
        wave = torch.frombuffer(bytearray(data), dtype=torch.uint8).float() / 255.0
        if self.draw:
            wave = wave * (1.0 + 0.01 * random.random())
        return wave, index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpu-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--draw", action="store_true")
    args = parser.parse_args()
    dataset = Clips(args.root, args.cpu_ms / 1e3, args.draw)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    seen = 0
    for _ in range(args.epochs):
        for wave, _label in loader:
            time.sleep(len(wave) / args.rate)
            seen += len(wave)
    print(f"samples {seen}")


if __name__ == "__main__":
    main()
