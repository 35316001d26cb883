"""An ImageNet training script shaped like pytorch/examples' ``imagenet/main.py``, with nothing
of unstall in its data path: an ``ImageFolder``-like dataset that opens and decodes each JPEG
with PIL in ``__getitem__``, random-resized crop + flip, float conversion and normalize on the
CPU, a training and a validation loader, ``pin_memory=True``.

    python examples/imagenet_like.py DATA_DIR -j 8 -b 64              # as it is
    unstall analyze --quick -- python examples/imagenet_like.py DATA_DIR -j 8
    unstall run --config unstall-report/recommendation.json -- \
        python examples/imagenet_like.py DATA_DIR

``DATA_DIR`` holds ``CLASS/*.jpg`` (``--make-data N`` writes N synthetic ~500x375 JPEGs
there first). Without a GPU the model is simulated: each step takes ``batch / --rate``
seconds (a GPU takes no host CPU); on a CUDA device ``--arch resnet18`` trains for real.
"""

import argparse
import math
import os
import random
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class ImageFolderLike(Dataset):
    """``root/CLASS/IMAGE.jpg``: ``samples`` is a list of ``(path, class index)``, as in
    torchvision's ``ImageFolder``."""

    def __init__(self, root: str, train: bool):
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
            if f.lower().endswith((".jpg", ".jpeg"))
        ]
        self.train = train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        img = random_resized_crop(img, 224) if self.train else center_crop(img, 256, 224)
        if self.train and random.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        x = x.float().div_(255)  # ToTensor
        return (x - MEAN) / STD, target  # Normalize


def random_resized_crop(img: Image.Image, size: int) -> Image.Image:
    """torchvision's RandomResizedCrop(size): area 8-100 %, aspect ratio 3/4-4/3."""
    w, h = img.size
    for _ in range(10):
        area = w * h * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = random.randint(0, w - cw), random.randint(0, h - ch)
            return img.resize((size, size), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
    return center_crop(img, size, size)


def center_crop(img: Image.Image, resize: int, size: int) -> Image.Image:
    w, h = img.size
    s = resize / min(w, h)
    img = img.resize((round(w * s), round(h * s)), Image.Resampling.BILINEAR)
    w, h = img.size
    x, y = (w - size) // 2, (h - size) // 2
    return img.crop((x, y, x + size, y + size))


class SimulatedModel:
    """``batch / rate`` seconds per step, sleeping; oversleeping is made up next step."""

    def __init__(self, rate: float):
        self.rate, self.debt = rate, 0.0

    def __call__(self, images: torch.Tensor, target: torch.Tensor) -> None:
        start = time.perf_counter()
        end = start + max(0.0, len(images) / self.rate - self.debt)
        if end > start:
            time.sleep(end - start)
        self.debt = min(0.01, max(0.0, time.perf_counter() - end))


def real_model(arch: str):
    from unstall.models.nets import build  # torchvision's ResNets, without torchvision

    model = build(arch).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(images: torch.Tensor, target: torch.Tensor) -> None:
        images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        target = target.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def evaluate(images: torch.Tensor, target: torch.Tensor) -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(images.cuda(non_blocking=True).to(memory_format=torch.channels_last))

    return step, evaluate


def main() -> None:
    p = argparse.ArgumentParser(description="ImageNet-shaped training (pytorch/examples style)")
    p.add_argument("data")
    p.add_argument("-j", "--workers", type=int, default=8)
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--arch", default="simulated", help="simulated, resnet18, resnet50 (CUDA)")
    p.add_argument("--rate", type=float, default=2000.0, help="simulated model's samples/s")
    p.add_argument("--make-data", type=int, default=0, metavar="N")
    args = p.parse_args()
    if args.make_data and not os.path.isdir(args.data):
        from unstall.data.synthetic import render_image

        for i in range(args.make_data):
            os.makedirs(os.path.join(args.data, f"c{i % 10}"), exist_ok=True)
            with open(os.path.join(args.data, f"c{i % 10}", f"{i:06d}.jpg"), "wb") as f:
                f.write(render_image(0, i, classes=10))
    train_set = ImageFolderLike(args.data, train=True)
    val_set = ImageFolderLike(args.data, train=False)
    val_set.samples = val_set.samples[::25]  # ImageNet's validation set is 1/25 of its training set
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
    )
    val_loader = DataLoader(
        val_set, batch_size=args.batch_size, shuffle=False, num_workers=args.workers
    )
    if args.arch == "simulated":
        step = evaluate = SimulatedModel(args.rate)
    else:
        step, evaluate = real_model(args.arch)
    for epoch in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for images, target in train_loader:
            step(images, target)
            seen += len(images)
        rate = seen / (time.perf_counter() - start)
        for images, target in val_loader:
            evaluate(images, target)
        print(f"epoch {epoch}: {seen} images, {rate:,.0f} images/s", flush=True)


if __name__ == "__main__":
    main()
