"""What the analyzer runs: a dataset, how it is loaded, the model's step; the built-in one.

The built-in workload is the standard image pipeline over a folder or bucket, and a
model: on a GPU it trains for real (bf16 autocast, channels_last, SGD); without one,
or with ``rate`` set, a simulated accelerator holds each batch for as long as the
model would take (DESIGN.md section 8: ResNet-50 ~4,000 samples/s on an H100).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from unstall import machine
from unstall.loader import DataLoader, SplitDataset
from unstall.loader.sampling import OrderSpec


@dataclass
class Workload:
    """What the analyzer runs: a dataset, how it is loaded, and the model's step.

    Args:
        dataset: the training dataset (map-style). One with ``fetch``/``prepare``
            (`unstall.FileDataset`) is measured fetch and prepare apart; a plain one
            is split by the workers' CPU time (prepare) and the rest (fetch).
        step: trains on one batch (returns when the step is done).
        batch_size, num_workers, seed: the loader's settings.
        loader_kwargs: other `unstall.DataLoader` arguments (``collate_fn``, ``device``...).
        to_device: puts a host batch where ``step`` wants it (the synthetic run keeps
            one such batch).
        name: shown in the report.
    """

    dataset: Any
    step: Callable[[Any], None]
    batch_size: int
    num_workers: int
    seed: int = 0
    loader_kwargs: dict[str, Any] = field(default_factory=dict)
    to_device: Callable[[Any], Any] | None = None
    name: str = "workload"

    @property
    def split(self) -> bool:
        return isinstance(self.dataset, SplitDataset)

    def order(self) -> OrderSpec:
        return OrderSpec(
            num_samples=len(self.dataset),
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=True,
            seed=self.seed,
        )

    def loader(self, *, cache: Any = None, **extra: Any) -> DataLoader:
        """An `unstall.DataLoader` over the known order (seeded, shuffled), spans recorded."""
        kwargs = {
            "batch_size": self.batch_size,
            "shuffle": True,
            "drop_last": True,
            "num_workers": self.num_workers,
            "seed": self.seed,
            "cache": cache if cache is not None else False,  # no default disk tier either
            **self.loader_kwargs,
            **extra,
        }
        with timeline_on():
            return DataLoader(self.dataset, **kwargs)


@contextlib.contextmanager
def timeline_on() -> Iterator[None]:
    """Loaders made inside keep per-batch spans (``stats()["timeline"]``)."""
    from unstall.loader import schedclock

    with machine.environment({"UNSTALL_TIMELINE": "1"}):
        schedclock.enable()  # stays on: the workers start later, at iter()
        yield


def step_indices(work: Workload, batches: int) -> list[int]:
    """The sample indices the first ``batches`` batches of epoch 0 read, in order."""
    out: list[int] = []
    for b, indices in enumerate(work.order().batches(0)):
        if b >= batches:
            break
        out.extend(indices)
    return out


def builtin_workload(
    data: str | os.PathLike[str],
    *,
    model: str = "resnet50",
    rate: float | None = None,
    batch_size: int = 64,
    num_workers: int | None = None,
) -> Workload:
    """``ImageFolder(data)`` (`ImagePipeline`) feeding ``model``: real on a GPU, else simulated."""
    from unstall.data import ImageFolder
    from unstall.models.simulated import MODEL_RATES

    if model not in MODEL_RATES:
        raise ValueError(f"model={model!r} is not known; choose one of {sorted(MODEL_RATES)}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate={rate} must be > 0 samples/s")
    dataset = ImageFolder(os.fspath(data))
    workers = num_workers if num_workers is not None else machine.cores_available()
    if rate is None and torch.cuda.is_available():
        step, to_device = _real_model(model)
        name = f"{model} on {torch.cuda.get_device_name()}"
    else:
        from unstall.models.simulated import SimulatedAccelerator

        rate = rate or MODEL_RATES[model]
        step, to_device = SimulatedAccelerator(rate).step, None
        name = f"{model} (simulated at {rate:,.0f} samples/s)"
    return Workload(
        dataset,
        step,
        batch_size=batch_size,
        num_workers=workers,
        to_device=to_device,
        name=f"{name}, {os.fspath(data)}",
    )


def _real_model(name: str) -> tuple[Callable[[Any], None], Callable[[Any], Any]]:
    from unstall.models.nets import build

    net = build(name).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def to_device(batch: Any) -> Any:
        images, labels = batch
        images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        return images, labels.cuda(non_blocking=True)

    def step(batch: Any) -> None:
        images, labels = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    return step, to_device
