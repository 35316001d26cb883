"""Batches onto the accelerator one ahead: copy on a side stream, then an on-device transform.

With ``device="cuda"`` each host batch is copied (pinned, ``non_blocking``) on a
side CUDA stream while the training step runs on the current stream, and the
optional ``device_transform`` (e.g. `NormalizeImages`: uint8 -> normalized
float, channels_last) runs on the same side stream; the step's stream waits for
that work only when the batch is handed out. ``device="cpu"`` runs the same
code (the "copy" is a real copy, so slot memory is never handed out), which is
how CI tests it. A GPU ``prep`` (decode + augment) runs in one helper thread,
one batch ahead, so its host-side work overlaps the step too. A prep with
``submit``/``finish`` (the GPU stage's `HybridPrep`) is fed the next batch before the
current one is taken from it, so its engine (DALI) has two batches in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

#: A batch transform run on the device (after the copy, on the side stream).
DeviceTransform = Callable[[Any], Any]


def resolve_device(device: Any) -> torch.device | None:
    """``None`` stays None; strings and devices become a `torch.device`; errors name the fix."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a device: use None, 'cpu' or 'cuda'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available: use device='cpu' or None")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class NormalizeImages:
    """The standard pipeline's on-device step: uint8 ``N x 3 x H x W`` -> normalized floats.

    Applied to every 4-D tensor in the batch (tuples, lists, dicts): uint8 ones are
    scaled and normalized, ``(x / 255 - mean) / std``, in one multiply and one add;
    float ones (already normalized, e.g. by GPU prep) are only re-laid out.

    Args:
        mean, std: per-channel values in 0-1 pixel units (default: ImageNet's,
            ``unstall.pipeline.IMAGENET_MEAN``/``IMAGENET_STD``).
        channels_last: convert to channels_last memory format (for conv nets).
        dtype: float dtype of the result (e.g. ``torch.bfloat16``).
    """

    def __init__(
        self,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        *,
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
    ):
        if mean is None or std is None:
            from unstall.pipeline import IMAGENET_MEAN, IMAGENET_STD  # lazy: keeps import light

            mean = IMAGENET_MEAN if mean is None else mean
            std = IMAGENET_STD if std is None else std
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean={mean!r}, std={std!r} need 3 values each, std positive")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} must be a float dtype, e.g. torch.float32")
        self.mean, self.std = tuple(mean), tuple(std)
        self.channels_last = channels_last
        self.dtype = dtype

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return self._images(batch) if batch.dim() == 4 else batch
        if type(batch) in (tuple, list):
            return type(batch)(self(x) for x in batch)
        if type(batch) is dict:
            return {k: self(v) for k, v in batch.items()}
        return batch

    def _images(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if x.dtype != torch.uint8:
            return x
        mul, add = self.affine(x.device)
        out = x.to(torch.float32).mul_(mul).add_(add)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def affine(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``mul, add`` with ``x * mul + add == (x / 255 - mean) / std``, cached per device."""
        from unstall.pipeline.transforms import normalize_affine  # lazy: keeps import light

        return normalize_affine(self.mean, self.std, device)

    def __repr__(self) -> str:
        return (
            f"NormalizeImages(mean={self.mean}, std={self.std}, "
            f"channels_last={self.channels_last}, dtype={self.dtype})"
        )


class _Started:
    """A batch fed to a split prep (its ``submit`` ran or is queued); `finish` takes it."""

    __slots__ = ("future",)

    def __init__(self, future: Future[Any]):
        self.future = future


class DeviceStage:
    """Moves host batches to ``device`` one ahead, holding each until its copy is done.

    ``submit(batch)`` starts the copy (and ``prep``/``transform``) and returns a
    handle; ``finish(handle)`` returns the device batch, ready for the current
    stream. The host batch is referenced until the copy from it has completed, so
    its zero-copy slot (freed when nothing references it) is never reused early.
    Handles are finished in the order submitted (the loader's iterator does so); a
    split prep's batches fed but never taken are taken and dropped at `close`, so its
    engine never hands a later epoch an earlier batch's images.
    """

    def __init__(
        self,
        device: torch.device,
        transform: DeviceTransform | None = None,
        *,
        prep: Callable[[Any, torch.device], Any] | None = None,
        timed: Callable[[float, float], None] | None = None,
    ):
        self.device = device
        self.transform = transform
        self.prep = prep
        self.timed = timed  # gets (wall s, CPU s) of each batch's host-side work
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._copying: deque[tuple[Any, Any]] = deque()  # (copy event, host batch)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="unstall-prep") if prep else None
        split = prep is not None and hasattr(prep, "submit") and hasattr(prep, "finish")
        self._split = split  # feed the engine at submit, take its output at finish
        self._fed: deque[_Started] = deque()  # split batches fed, not yet finished

    def submit(self, batch: Any) -> Any:
        if self._pool is None:
            return self._run(batch)
        if self._split:
            started = _Started(self._pool.submit(self._feed, batch))
            self._fed.append(started)
            return started
        return self._pool.submit(self._run, batch)

    def finish(self, handle: Any) -> Any:
        if isinstance(handle, _Started):  # after the next batch was fed (one thread, in order)
            self._fed.remove(handle)
            handle = self._pool.submit(self._take, handle.future)  # type: ignore[union-attr]
        out, event = handle.result() if isinstance(handle, Future) else handle
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
            _record_stream(out, torch.cuda.current_stream(self.device))
        self._poll()
        return out

    def close(self) -> None:
        """Take fed batches back from a split prep, wait for copies in flight, drop their host
        batches; stop the prep thread."""
        while self._fed and self._pool is not None:
            fed = self._fed.popleft()
            with contextlib.suppress(Exception):  # a batch that failed is as good as taken
                self._pool.submit(self._take, fed.future).result()
        while self._copying:
            self._copying.popleft()[0].synchronize()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _run(self, batch: Any) -> tuple[Any, Any]:
        if self.timed is None:
            return self._work(batch)
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self._work(batch)
        self.timed(time.perf_counter() - t0, time.thread_time() - c0)
        return out

    def _work(self, batch: Any) -> tuple[Any, Any]:
        if not self.cuda:  # a real copy: the slot is free once ``batch`` is dropped
            out = self.prep(batch, self.device) if self.prep else _to(batch, self.device, True)
            del batch
            return (self.transform(out) if self.transform else out), None
        with torch.cuda.stream(self.stream):
            if self.prep is not None:
                out = self.prep(batch, self.device)
            else:
                out = _to(_pinned(batch), self.device, False)
            return self._after(out, batch)

    def _feed(self, batch: Any) -> tuple[Any, Any, float, float]:
        """A split prep's first half on the prep thread: ``(its handle, batch, wall, CPU)``."""
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.cuda:
            with torch.cuda.stream(self.stream):
                handle = self.prep.submit(batch, self.device)  # type: ignore[union-attr]
        else:
            handle = self.prep.submit(batch, self.device)  # type: ignore[union-attr]
        return handle, batch, time.perf_counter() - t0, time.thread_time() - c0

    def _take(self, fed: Future[Any]) -> tuple[Any, Any]:
        """A split prep's second half: the fed batch's output, on the device."""
        handle, batch, wall, cpu = fed.result()
        t0, c0 = time.perf_counter(), time.thread_time()
        if self.cuda:
            with torch.cuda.stream(self.stream):
                out = self._after(self.prep.finish(handle), batch)  # type: ignore[union-attr]
        else:
            out = self.prep.finish(handle)  # type: ignore[union-attr]
            del batch
            out = ((self.transform(out) if self.transform else out), None)
        if self.timed is not None:
            self.timed(wall + time.perf_counter() - t0, cpu + time.thread_time() - c0)
        return out

    def _after(self, out: Any, batch: Any) -> tuple[Any, Any]:
        """On the side stream: mark the copy, run the transform, mark the batch done."""
        copied = torch.cuda.Event()
        copied.record(self.stream)
        if self.transform is not None:
            out = self.transform(out)
        done = torch.cuda.Event()
        done.record(self.stream)
        self._copying.append((copied, batch))
        return out, done

    def _poll(self) -> None:
        while self._copying and self._copying[0][0].query():
            self._copying.popleft()


def _to(batch: Any, device: torch.device, copy: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=not copy, copy=copy)
    if type(batch) in (tuple, list):
        return type(batch)(_to(x, device, copy) for x in batch)
    if type(batch) is dict:
        return {k: _to(v, device, copy) for k, v in batch.items()}
    return batch


def _pinned(batch: Any) -> Any:
    """Pin tensors that are not already (slot memory is registered with CUDA once, see slots)."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() or batch.is_cuda else batch.pin_memory()
    if type(batch) in (tuple, list):
        return type(batch)(_pinned(x) for x in batch)
    if type(batch) is dict:
        return {k: _pinned(v) for k, v in batch.items()}
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif type(batch) in (tuple, list):
        for x in batch:
            _record_stream(x, stream)
    elif type(batch) is dict:
        for x in batch.values():
            _record_stream(x, stream)
