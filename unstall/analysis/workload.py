"""The built-in workload: the standard image pipeline over a folder or bucket, and a model.

On a GPU the model trains for real (bf16 autocast, channels_last, SGD); without one,
or with ``rate`` set, a simulated accelerator holds each batch for as long as the
model would take (DESIGN.md section 8: ResNet-50 ~4,000 samples/s on an H100).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from unstall.analysis.runs import Workload


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
    workers = num_workers if num_workers is not None else len(os.sched_getaffinity(0))
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
