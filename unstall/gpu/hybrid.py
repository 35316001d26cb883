"""The training process's side of hybrid prep: one split batch in, one device batch out.

A split batch (`unstall.gpu.split`) holds lean uint8 rows the CPU workers prepared
and the encoded rest. `HybridPrep` (the `DeviceStage`'s prep, run on its thread one
batch ahead, never on the training loop's) starts the lean rows' copy and normalize
on the device, then sends the rest to the engine (so neither side's rows wait on the
other's), puts every row back at its place in the batch, and tells the `ShareController`
what each side took, so the next batches' split follows the measured rates.

The GPU side's time is the device's: on CUDA, events recorded on the stream around
the engine's work (its kernels and DALI's run asynchronously, so the host clock
would under-count them), read once they have completed, without waiting; the
batch's cost is the larger of that and the host time the engine held this thread,
and with batches in flight it is counted from the previous batch's end, not twice.
On a CPU device the host clock is the engine's time. ``submit``/``finish`` let a
caller feed the next batch before taking this one (DALI then overlaps them);
calling the prep does both at once. Each batch's engine time also goes to the
decoder tuner (`unstall.gpu.tune`), whose choice the engine applies from the next batch.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from unstall.gpu.controller import ShareController
from unstall.gpu.engine import Engine
from unstall.gpu.split import CPU_ROWS, LEAN, TIMES, gpu_rows, split_sizes
from unstall.gpu.tune import DecoderTuner


@dataclass
class _Batch:
    """A submitted batch: what `HybridPrep.finish` needs, and its timing so far."""

    batch: Any
    device: torch.device
    n: int
    k: int
    started: Any  # the engine's handle, or None
    start: Any  # CUDA event before the engine's work, or None
    host_s: float
    lean: Any = None  # the CPU workers' rows, normalized on the device at submit


@dataclass
class _Timed:
    """A finished batch whose device time is read once its end event has completed."""

    n: int
    k: int
    times: tuple[float, float]
    host_s: float
    start: Any = None
    end: Any = None
    previous_end: Any = None


class HybridPrep:
    """Prepares split batches on ``device``: engine for the encoded rows, normalize for the lean.

    Args:
        pipeline: the dataset's `ImagePipeline` (size, mean, std).
        engine: the GPU stage's engine (`unstall.gpu.engine.Engine`).
        controller: decides the next batches' CPU share.
        cpu_rows: the shared int the workers read (`unstall.gpu.split.shared_rows`).
        tuner: chooses the engine's decoder settings by measurement (`unstall.gpu.tune`),
            or None.
    """

    def __init__(
        self,
        pipeline: Any,
        engine: Engine,
        controller: ShareController,
        cpu_rows: Any,
        tuner: DecoderTuner | None = None,
    ):
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.engine = engine
        self.controller = controller
        self.cpu_rows = cpu_rows
        self.tuner = tuner
        self.engine_s = 0.0  # the GPU side's time, as the controller saw it
        self.engine_host_s = 0.0  # of which the host held the prep thread
        self.engine_batches = 0
        self._timed: deque[_Timed] = deque()
        self._last_end: Any = None

    def __call__(self, batch: Any, device: torch.device) -> Any:
        return self.finish(self.submit(batch, device))

    def submit(self, batch: Any, device: torch.device) -> _Batch:
        """Start the batch's engine rows (fed to DALI now); `finish` returns the batch."""
        split = batch[0] if type(batch) is list else batch
        n, k = split_sizes(split)
        started = start = None
        host_s = 0.0
        # the workers' rows first: on their way while the engine works, never queued after it
        lean = self._normalize(split[LEAN], device) if k > 0 else None
        if n - k > 0:
            start = _event(device)
            t0 = time.perf_counter()
            submit = getattr(self.engine, "submit", None)
            started = submit(split, device) if submit is not None else None
            host_s = time.perf_counter() - t0
        return _Batch(batch, device, n, k, started, start, host_s, lean)

    def finish(self, handle: _Batch) -> Any:
        """The batch `submit` started, on the device (batches finish in submission order)."""
        batch, device = handle.batch, handle.device
        if type(batch) is list:
            return [self._images(handle), *(_to(x, device) for x in batch[1:])]
        return self._images(handle)

    def images(self, split: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """The split batch's images in order, normalized float32 on ``device``."""
        return self.finish(self.submit(split, device))

    def _images(self, handle: _Batch) -> torch.Tensor:
        split = handle.batch[0] if type(handle.batch) is list else handle.batch
        device, n, k = handle.device, handle.n, handle.k
        out: torch.Tensor | None = None
        timed = _Timed(n, k, tuple(float(x) for x in split[TIMES].tolist()), handle.host_s)
        if n - k > 0:
            t0 = time.perf_counter()
            if handle.started is not None:
                out = self.engine.finish(handle.started)  # type: ignore[attr-defined]
            else:
                out = self.engine(split, device)
            timed.host_s += time.perf_counter() - t0
            timed.start, timed.end = handle.start, _event(device)
            timed.previous_end, self._last_end = self._last_end, timed.end
        if k > 0:
            lean = handle.lean
            if out is None:
                out = lean  # every row on the CPU, in batch order
            else:
                whole = torch.empty((n, 3, *self.size), dtype=torch.float32, device=device)
                whole.index_copy_(0, _index(split[CPU_ROWS], device), lean)
                whole.index_copy_(0, _index(torch.from_numpy(gpu_rows(split)), device), out)
                out = whole
        assert out is not None  # n >= 1: one side had rows
        self._timed.append(timed)
        self._observe()
        if getattr(self.engine, "cpu_only", False) and self.controller.mode != "cpu":
            self.controller.give_up_gpu(f"every GPU engine failed ({_failures(self.engine)})")
            self.cpu_rows.value = self.controller.cpu_rows
        return out

    def _observe(self) -> None:
        """Tell the controller about every batch whose device time is known, in order."""
        while self._timed and (self._timed[0].end is None or self._timed[0].end.query()):
            t = self._timed.popleft()
            gpu_s = t.host_s
            if t.end is not None and t.start is not None:
                device_s = t.start.elapsed_time(t.end) / 1e3
                if t.previous_end is not None:  # batches in flight: count from the last one's end
                    since = t.previous_end.elapsed_time(t.end) / 1e3
                    device_s = min(device_s, since) if since > 0 else device_s
                gpu_s = max(gpu_s, device_s)
            if t.n - t.k > 0:
                self.engine_s += gpu_s
                self.engine_host_s += t.host_s
                self.engine_batches += 1
                self._tune(t.n - t.k, gpu_s)
            rows = self.controller.observe(t.n, t.k, *t.times, gpu_s if t.n > t.k else 0.0)
            self.cpu_rows.value = rows

    def _tune(self, samples: int, gpu_s: float) -> None:
        """Tell the decoder tuner; apply the setting it asks for (from the next batch on)."""
        if self.tuner is None:
            return
        change = self.tuner.observe(samples, gpu_s)
        retune = getattr(self.engine, "retune", None)
        if change is not None and (retune is None or not retune(change)):
            self.tuner = None  # the engine in use has no such settings (it fell back)

    def _normalize(self, lean: torch.Tensor, device: torch.device) -> torch.Tensor:
        from unstall.pipeline import normalize_batch

        return normalize_batch(lean, mean=self.mean, std=self.std, device=device)

    def stats(self) -> dict[str, Any]:
        """The ``prep`` section of ``loader.stats()``: which side ran what, why, with what."""
        batches = max(1, self.engine_batches)
        out = {
            **self.controller.summary(),
            "engine": self.engine.name,
            "engine_s": round(self.engine_s, 6),
            "engine_ms_per_batch": round(1e3 * self.engine_s / batches, 3),
            "engine_host_ms_per_batch": round(1e3 * self.engine_host_s / batches, 3),
            "engine_clock": "cuda events" if self._last_end is not None else "host",
        }
        timings = getattr(self.engine, "timings", None)
        out.update(timings() if timings is not None else {})
        if self.tuner is not None:
            out.update(self.tuner.summary())
        failures = getattr(self.engine, "failures", None)
        if failures:
            out["engine_failures"] = list(failures)
        return out

    def close(self) -> None:
        """Release the engine (DALI's threads and buffers)."""
        self._timed.clear()
        self.engine.close()


def _event(device: torch.device) -> Any:
    """A timing event recorded now on ``device``'s current stream; None on a CPU device."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _failures(engine: Any) -> str:
    return "; ".join(getattr(engine, "failures", [])) or "no reason recorded"


def _index(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return rows
    return rows.pin_memory().to(device, non_blocking=True)


def _to(x: Any, device: torch.device) -> Any:
    return x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x
