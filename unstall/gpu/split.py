"""The workers' side of hybrid prep: every sample gets its crop drawn, some get prepared too.

`SplitView` wraps a `FileDataset` whose transform is the standard `ImagePipeline`.
Its ``prepare`` draws each sample's RandomResizedCrop box and flip from the
pipeline's own stream (same draws, same per-batch seeding as on the CPU path), so
a sample's augmentation does not depend on which side prepares it. `collate_split`
then prepares the first ``cpu_rows`` samples of the batch as lean uint8 on the
worker (plus any the GPU engine may reject: CMYK, non-JPEG, unreadable header)
and packs the rest's encoded bytes for the GPU stage. ``cpu_rows`` is a shared
integer the main process's `ShareController` updates as rates are measured.
"""

from __future__ import annotations

import copy
import ctypes
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
import torch
import torch.utils.data

from unstall.errors import SampleError
from unstall.gpu.prep import ENCODED, EncodedImage, _encode, draw

#: Keys of a split batch besides the encoded part's (`unstall.gpu.prep._encode`).
LEAN, CPU_ROWS, TIMES = "lean", "cpu_rows", "times"
_GPU_COLORSPACES = ("RGB", "YCbCr", "Gray")  # what the JPEG decoders agree on with the CPU's


@dataclass(frozen=True)
class SplitImage(EncodedImage):
    """An `EncodedImage`; ``gpu_ok`` False: only the CPU may prepare it (e.g. CMYK)."""

    gpu_ok: bool = True


class SplitView:
    """What hybrid prep's workers load: bytes plus crop for every sample (see module doc).

    Args:
        dataset: a `FileDataset` (``fetch``/``key``/``labels``) with ``ImagePipeline``.
        pipeline: that pipeline (its boxes, flips, size).
        cpu_rows: shared count of samples per batch the workers prepare themselves.
    """

    def __init__(self, dataset: Any, pipeline: Any, cpu_rows: Any):
        self.dataset = dataset
        self.pipeline = pipeline
        self.lean = copy.copy(pipeline)
        self.lean.output = "uint8"
        self.cpu_rows = cpu_rows
        self._started: float | None = None  # this process's current batch began (perf_counter)

    def __len__(self) -> int:
        return len(self.dataset)

    def key(self, index: int) -> str:
        return self.dataset.key(index)

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        self._mark()
        return self.dataset.fetch(indices)

    def prepare(self, index: int, raw: bytes) -> Any:
        self._mark()
        try:
            box, flip = draw(self.pipeline, raw)
        except Exception as exc:
            raise self._error(index, exc) from exc
        image = SplitImage(bytes(raw), box, flip, index, gpu_ok=engine_accepts(raw))
        labels = getattr(self.dataset, "labels", None)
        return image if labels is None else (image, int(labels[index]))

    def __getitem__(self, index: int) -> Any:
        return self.prepare(index, self.fetch([index])[0])

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "pipeline", "lean", "cpu_rows") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def collate(self, samples: list[Any]) -> Any:
        """The split batch: lean uint8 rows from this worker, the rest's bytes for the GPU."""
        with_labels = type(samples[0]) is tuple
        images: list[SplitImage] = [s[0] for s in samples] if with_labels else samples
        k = min(max(int(self.cpu_rows.value), 0), len(images))
        on_cpu = [i for i, im in enumerate(images) if i < k or not im.gpu_ok]
        c0 = time.perf_counter()
        lean = torch.empty((len(on_cpu), 3, *self.lean.size), dtype=torch.uint8)
        for row, i in enumerate(on_cpu):
            im = images[i]
            try:
                lean[row] = self.lean.apply(im.data, im.box, flip=im.flip)
            except Exception as exc:
                raise self._error(im.index, exc) from exc
        cpu_s = time.perf_counter() - c0
        fixed_s = c0 - (self._started if self._started is not None else c0)
        self._started = None
        taken = set(on_cpu)
        batch = _encode([im for i, im in enumerate(images) if i not in taken])
        batch[LEAN] = lean
        batch[CPU_ROWS] = torch.tensor(on_cpu, dtype=torch.int64)
        batch[TIMES] = torch.tensor([fixed_s, cpu_s], dtype=torch.float64)
        if not with_labels:
            return batch
        rest = torch.utils.data.default_collate([s[1:] for s in samples])
        return [batch, *rest]

    def _mark(self) -> None:
        if self._started is None:
            self._started = time.perf_counter()

    def _error(self, index: int, exc: Exception) -> SampleError:
        key = self.dataset.key(index)
        return SampleError(
            f"cannot prepare sample {index} (key {key!r}): {type(exc).__name__}: {exc}",
            index=index,
            key=key,
        )


def engine_accepts(raw: bytes) -> bool:
    """Whether GPU engines decode ``raw`` as the CPU path would: a baseline/progressive JPEG
    in RGB, YCbCr or grey. CMYK/YCCK (Adobe's inverted ink), other formats and headers
    libjpeg-turbo cannot read go to the CPU workers, which decode them with PIL."""
    if raw[:3] != b"\xff\xd8\xff":
        return False
    try:
        _, _, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError:
        return False
    return colorspace in _GPU_COLORSPACES


def shared_rows(start: int) -> Any:
    """A process-shared int (``.value``) the workers read at each batch; inherited, no file."""
    value = multiprocessing.get_context().RawValue(ctypes.c_int64, start)
    return value


def split_sizes(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """``(samples, of which CPU-prepared)`` of a split batch."""
    k = int(batch[CPU_ROWS].numel())
    return k + int(batch["offsets"].numel()) - 1, k


def gpu_rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    """Positions in the batch of the samples the GPU stage prepares."""
    n, _ = split_sizes(batch)
    mask = np.ones(n, dtype=bool)
    mask[batch[CPU_ROWS].numpy()] = False
    return np.flatnonzero(mask)


__all__ = ["CPU_ROWS", "ENCODED", "LEAN", "TIMES", "SplitView", "engine_accepts", "shared_rows"]
