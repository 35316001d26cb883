"""`bench local`: local JPEG files, cold (page cache dropped) and warm, same pipeline.

torch's DataLoader reads one file per ``__getitem__`` (a plain map-style
dataset, as torchvision's ImageFolder does); unstall fetches whole batches.
Both run the same decode + RandomResizedCrop + flip + normalize pipeline, the
same workers and batch size, feeding a simulated accelerator at ResNet-50's
H100 rate, so the table shows how much of the time the model would wait.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from unstall import machine
from unstall.bench.harness import BenchResult, Measurement, measure, median_of, row
from unstall.data import ImageFolder
from unstall.loader import DataLoader
from unstall.models.simulated import MODEL_RATES
from unstall.stores import LocalStore

DESCRIPTION = "local JPEG files, cold and warm page cache: torch vs unstall, same pipeline"


class PerSample(torch.utils.data.Dataset):
    """Hides ``__getitems__``: what a typical map-style dataset looks like to torch."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def dataset_dir(images: int, console: Any = None) -> str:
    """The synthetic benchmark dataset (made once, reused), honouring UNSTALL_CACHE_DIR."""
    from unstall.data.synthetic import ensure_demo_dataset

    return os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0))


def run(
    *,
    quick: bool,
    console: Any = None,
    rate: float = MODEL_RATES["resnet50"],
    repeats: int = 3,
    on_batch: Callable[[int], None] | None = None,
) -> BenchResult:
    images = 640 if quick else 2560
    batch_size, workers = 64, min(2, machine.cores_available())
    root = dataset_dir(images, console)
    store = LocalStore(root)
    dataset = ImageFolder(store)
    loaders: dict[str, Callable[[], Any]] = {
        "torch": lambda: torch.utils.data.DataLoader(
            PerSample(dataset), batch_size=batch_size, shuffle=True, num_workers=workers
        ),
        "unstall": lambda: DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers
        ),
    }
    runs: dict[tuple[str, str], list[Measurement]] = {}
    for _ in range(repeats):  # interleaved: drift on a busy machine hits both loaders alike
        for phase in ("cold", "warm"):
            for name, make in loaders.items():
                if phase == "cold":
                    store.drop_page_cache()
                else:
                    measure(make(), max_batches=2)  # touch the files: page cache warm
                m = measure(make(), rate=rate, on_batch=on_batch)
                runs.setdefault((phase, name), []).append(m)
                if console is not None:
                    console.print(f"  {phase:5s} {name:8s} {m.samples_per_s:8.1f} samples/s")
    results = {k: median_of(v) for k, v in runs.items()}
    rows, per_phase = [], {}
    for phase in ("cold", "warm"):
        t, u = results[phase, "torch"], results[phase, "unstall"]
        ratio = u.samples_per_s / t.samples_per_s
        per_phase[phase] = {"ratio": round(ratio, 4), "torch": t.as_dict(), "unstall": u.as_dict()}
        rows.append(row(phase, "torch", t))
        rows.append(row(phase, "unstall", u, ratio))
    cold_t, cold_u = results["cold", "torch"], results["cold", "unstall"]
    return BenchResult(
        name="local",
        ratio=per_phase["cold"]["ratio"],
        baseline={"loader": "torch.utils.data.DataLoader", "samples_per_s": cold_t.samples_per_s},
        unstall={"loader": "unstall.DataLoader", "samples_per_s": cold_u.samples_per_s},
        rows=rows,
        detail={
            "phases": per_phase,
            "config": {
                "images": images,
                "batch_size": batch_size,
                "num_workers": workers,
                "accelerator_rate": rate,
                "repeats": repeats,
            },
        },
        notes=[
            f"simulated accelerator at {rate:,.0f} samples/s (ResNet-50 on one H100); "
            "stall % = share of wall time the model waited for data",
            f"median of {repeats} interleaved runs per cell; top-level ratio: cold; "
            "both loaders use the same pipeline and workers",
        ],
    )
