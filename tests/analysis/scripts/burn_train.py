"""An unedited training script with known ground truth (nothing of unstall in it).

Each sample costs ``--cpu-ms`` of CPU in ``__getitem__`` and ``--io-ms`` of sleeping (as a
read would); the "model" runs at ``--rate`` samples/s, sleeping (a GPU takes no host CPU).
A validation loader runs after each epoch with ``--val``.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class TrainSet(Dataset):
    def __init__(self, n: int, cpu_s: float, io_s: float):
        self.n, self.cpu_s, self.io_s = n, cpu_s, io_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.io_s:
            time.sleep(self.io_s)
        end = time.thread_time() + self.cpu_s
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.full((16,), float(index)), index % 10


class ValSet(TrainSet):
    pass


class Stream(torch.utils.data.IterableDataset):
    """The same samples as an iterable dataset: each worker yields its share."""

    def __init__(self, n: int, cpu_s: float):
        self.inner = TrainSet(n, cpu_s, 0.0)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, w = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, len(self.inner), w):
            yield self.inner[i]


#: The loop's own time between steps that the model's clock takes in (the loop handing over
#: the next batch while the model runs; a sleep waking late): a loop back later than that
#: waited for data, and the model waited with it.
LOOP_S = 0.002


class Model:
    """Runs at ``rate`` samples/s on its own clock, as a GPU runs its kernels while the loop
    hands it the next batch: a step ends batch / rate after the previous one ended, so the
    loop's own time between steps (up to `LOOP_S`) is inside the model's time, not added to
    it (a plain sleep per step made the model alone 6-11 % slower than its rate here)."""

    def __init__(self, rate: float):
        self.rate, self.end = rate, 0.0

    def step(self, n: int) -> None:
        now = time.perf_counter()
        start = self.end if now - self.end < LOOP_S else now
        self.end = start + n / self.rate
        time.sleep(max(0.0, self.end - now))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--val", action="store_true")
    p.add_argument("--cpu-ms", type=float, default=4.0)
    p.add_argument("--io-ms", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--batch-sampler", action="store_true")
    p.add_argument("--iterable", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    data = TrainSet(a.samples, a.cpu_ms / 1e3, a.io_ms / 1e3)
    extra = {"prefetch_factor": a.prefetch} if a.prefetch else {}
    if a.iterable:
        train = DataLoader(
            Stream(a.samples, a.cpu_ms / 1e3), batch_size=a.batch, num_workers=a.workers, **extra
        )
    elif a.batch_sampler:
        sampler = torch.utils.data.BatchSampler(
            torch.utils.data.RandomSampler(data), batch_size=a.batch, drop_last=True
        )
        train = DataLoader(
            data, batch_sampler=sampler, num_workers=a.workers, pin_memory=a.pin_memory, **extra
        )
    else:
        train = DataLoader(
            data,
            batch_size=a.batch,
            shuffle=True,
            num_workers=a.workers,
            pin_memory=a.pin_memory,
            **extra,
        )
    val = DataLoader(ValSet(a.samples // 8, a.cpu_ms / 1e3, 0.0), batch_size=a.batch, num_workers=1)
    model = Model(a.rate)
    for epoch in range(a.epochs):
        seen = 0
        for images, _labels in train:
            model.step(len(images))
            seen += len(images)
        if a.val:
            for images, _labels in val:
                model.step(len(images))
        print(f"epoch {epoch}: {seen} samples", flush=True)


if __name__ == "__main__":
    main()
