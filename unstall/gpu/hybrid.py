"""The training process's side of hybrid prep: one split batch in, one device batch out.

A split batch (`unstall.gpu.split`) holds lean uint8 rows the CPU workers prepared
and the encoded rest. `HybridPrep` (the `DeviceStage`'s prep, run on its thread one
batch ahead) sends the rest to the engine, normalizes the lean rows on the device,
puts every row back at its place in the batch, and tells the `ShareController`
what each side took, so the next batches' split follows the measured rates.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from unstall.gpu.controller import ShareController
from unstall.gpu.engine import Engine
from unstall.gpu.split import CPU_ROWS, LEAN, TIMES, gpu_rows, split_sizes


class HybridPrep:
    """Prepares split batches on ``device``: engine for the encoded rows, normalize for the lean.

    Args:
        pipeline: the dataset's `ImagePipeline` (size, mean, std).
        engine: the GPU stage's engine (`unstall.gpu.engine.Engine`).
        controller: decides the next batches' CPU share.
        cpu_rows: the shared int the workers read (`unstall.gpu.split.shared_rows`).
    """

    def __init__(self, pipeline: Any, engine: Engine, controller: ShareController, cpu_rows: Any):
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.engine = engine
        self.controller = controller
        self.cpu_rows = cpu_rows
        self.engine_s = 0.0

    def __call__(self, batch: Any, device: torch.device) -> Any:
        if type(batch) is list:
            return [self.images(batch[0], device), *(_to(x, device) for x in batch[1:])]
        return self.images(batch, device)

    def images(self, split: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """The batch's images in order, normalized float32 on ``device``."""
        n, k = split_sizes(split)
        gpu_s = 0.0
        out: torch.Tensor | None = None
        if n - k > 0:
            t0 = time.perf_counter()
            out = self.engine(split, device)
            gpu_s = time.perf_counter() - t0
            self.engine_s += gpu_s
        if k > 0:
            lean = self._normalize(split[LEAN], device)
            if out is None:
                out = lean  # every row on the CPU, in batch order
            else:
                whole = torch.empty((n, 3, *self.size), dtype=torch.float32, device=device)
                whole.index_copy_(0, _index(split[CPU_ROWS], device), lean)
                whole.index_copy_(0, _index(torch.from_numpy(gpu_rows(split)), device), out)
                out = whole
        assert out is not None  # n >= 1: one side had rows
        fixed_s, cpu_s = (float(x) for x in split[TIMES].tolist())
        rows = self.controller.observe(n, k, fixed_s, cpu_s, gpu_s)
        self.cpu_rows.value = rows
        return out

    def _normalize(self, lean: torch.Tensor, device: torch.device) -> torch.Tensor:
        from unstall.pipeline import normalize_batch

        return normalize_batch(lean, mean=self.mean, std=self.std, device=device)

    def stats(self) -> dict[str, Any]:
        """The ``prep`` section of ``loader.stats()``: which side ran what, why, with what."""
        return {
            **self.controller.summary(),
            "engine": self.engine.name,
            "engine_s": round(self.engine_s, 6),
        }

    def close(self) -> None:
        """Release the engine (DALI's threads and buffers)."""
        self.engine.close()


def _index(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return rows
    return rows.pin_memory().to(device, non_blocking=True)


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x
