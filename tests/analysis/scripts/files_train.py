"""An unedited training script whose Dataset opens its own files (nothing of unstall in it).

``--kind open``: a map-style Dataset over a list of paths (``self.paths``) reading each with
``open(path, "rb")``; ``--kind folder``: torchvision-style ``samples`` of (path, class) read
with PIL; ``--kind stream``: an iterable dataset over the same paths; ``--kind nofiles``: a
map-style dataset that names no files (it makes its samples).

Slow storage is modelled in the dataset, as `unstall.bench.filecache` does: each
``__getitem__`` sleeps for the bytes its worker read from storage (``/proc/self/io``
``read_bytes``, so bytes served from memory cost nothing) at ``--mb-per-s``, plus
``--latency-ms`` per file that touched storage; the page cache of the files is dropped
before each epoch (``posix_fadvise(DONTNEED)``). The "model" takes ``batch / --rate`` seconds
per step, sleeping (a GPU takes no host CPU).
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info


def storage_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])


class Slow:
    """Storage of ``mb_per_s`` per reader and ``latency_s`` per request that reached it."""

    def __init__(self, mb_per_s: float, latency_s: float):
        self.bytes_per_s, self.latency_s = mb_per_s * 1e6, latency_s

    def read(self, path: str, pil: bool) -> torch.Tensor:
        before = storage_read()
        if pil:
            from PIL import Image

            with Image.open(path) as img:
                raw = img.convert("L").tobytes()
        else:
            with open(path, "rb") as f:
                raw = f.read()
        got = storage_read() - before
        if got:  # the bytes that came from storage cost time
            time.sleep(self.latency_s + got / self.bytes_per_s)
        return torch.tensor([len(raw), raw[0], raw[-1]])


class Files(Dataset):
    def __init__(self, paths: list[str], slow: Slow):
        self.paths, self.slow = paths, slow

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return self.slow.read(self.paths[i], False), i % 10


class Folder(Dataset):  # torchvision-style: (path, class) pairs in .samples, read with PIL
    def __init__(self, paths: list[str], slow: Slow):
        self.samples = [(p, i % 10) for i, p in enumerate(paths)]
        self.slow = slow

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, target = self.samples[i]
        return self.slow.read(path, True), target


class Stream(IterableDataset):  # each worker reads its share of one shuffled order
    def __init__(self, paths: list[str], slow: Slow):
        self.paths, self.slow = paths, slow
        self.order = torch.randperm(len(paths), generator=torch.Generator().manual_seed(0))

    def __iter__(self):
        info = get_worker_info()
        k, w = (info.id, info.num_workers) if info else (0, 1)
        for i in self.order.tolist()[k::w]:
            yield self.slow.read(self.paths[i], False), i % 10


class Made(Dataset):  # names no files: its samples are made, as slowly as a file is read
    def __init__(self, n: int, wait_s: float):
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.wait_s)
        return torch.full((3,), float(i)), i % 10


class Model:
    """Takes batch / rate seconds per step, sleeping; oversleeping is made up on the next step."""

    def __init__(self, rate: float):
        self.rate, self.debt = rate, 0.0

    def step(self, n: int) -> None:
        start = time.perf_counter()
        target = start + max(0.0, n / self.rate - self.debt)
        if target > start:
            time.sleep(target - start)
        self.debt = min(0.01, max(0.0, time.perf_counter() - target))


def drop_page_cache(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--kind", default="open", choices=("open", "folder", "stream", "nofiles"))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mb-per-s", type=float, default=2.5)
    p.add_argument("--latency-ms", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=400.0)
    a = p.parse_args()
    torch.manual_seed(0)
    paths = sorted(os.path.join(a.root, n) for n in os.listdir(a.root))
    slow = Slow(a.mb_per_s, a.latency_ms / 1e3)
    if a.kind == "nofiles":
        data = Made(len(paths), slow.latency_s + os.path.getsize(paths[0]) / slow.bytes_per_s)
    else:
        data = {"open": Files, "folder": Folder, "stream": Stream}[a.kind](paths, slow)
    shuffle = {} if a.kind == "stream" else {"shuffle": True}
    train = DataLoader(data, batch_size=a.batch, num_workers=a.workers, **shuffle)
    model = Model(a.rate)
    for epoch in range(a.epochs):
        drop_page_cache(paths)
        seen = 0
        for images, _labels in train:
            model.step(len(images))
            seen += len(images)
        print(f"epoch {epoch}: {seen} samples", flush=True)


if __name__ == "__main__":
    main()
