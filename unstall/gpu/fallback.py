"""The GPU stage's engines in a chain: a failure at build or run time falls back to the next.

`FallbackEngine` holds the engine in use and makers for the rest (DALI, then a batch
decoder + `crop_flip_normalize`, then the CPU). An engine signals a failure of its
own (a pipeline that does not build, a CUDA error, a dead pipeline), as opposed to
an image it cannot decode, by raising `EngineError`; the chain then closes it,
logs one line naming the engine and the cause, and prepares the same batch (and
every later one) with the next. The last link, `CpuEngine`, prepares the batches
already split for the GPU on the stage's thread and tells `HybridPrep` to send
every later sample to the CPU workers (``cpu_only``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from unstall.errors import SampleError
from unstall.gpu.prep import ENCODED

log = logging.getLogger("unstall")


class EngineError(RuntimeError):
    """The engine itself failed (build, CUDA, dead pipeline): fall back, do not retry it."""


class CpuEngine:
    """The chain's last link: each encoded sample prepared by the pipeline on this thread.

    Used only for the few batches already split for the GPU when every GPU engine has
    failed; ``cpu_only`` makes `HybridPrep` give every later sample to the CPU workers.
    """

    cpu_only = True

    def __init__(self, pipeline: Any, key_of: Callable[[int], str], name: str = "CPU workers"):
        self.name = name
        self.key_of = key_of
        self._pipeline = copy.copy(pipeline)
        self._pipeline.output = "float"

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        return prepare_on_cpu(self._pipeline, encoded, device, self.key_of, self.name)

    def close(self) -> None:
        """Nothing held beyond memory."""


def prepare_on_cpu(
    pipeline: Any,
    encoded: dict[str, torch.Tensor],
    device: torch.device,
    key_of: Callable[[int], str],
    engine: str,
    cause: BaseException | None = None,
) -> torch.Tensor:
    """An encoded batch prepared image by image by ``pipeline`` (float output) on the CPU.

    A sample the CPU cannot decode either is named in a `SampleError` (chained to
    ``cause``, the engine's error, where there was one).
    """
    data, bounds = encoded[ENCODED].numpy(), encoded["offsets"].tolist()
    boxes, flips = encoded["boxes"].tolist(), encoded["flips"].tolist()
    out = []
    for i, index in enumerate(encoded["indices"].tolist()):
        raw = data[bounds[i] : bounds[i + 1]].tobytes()
        try:
            out.append(pipeline.apply(raw, tuple(boxes[i]), flip=bool(flips[i])))
        except Exception as err:
            key = key_of(index)
            raise SampleError(
                f"cannot decode sample {index} (key {key!r}) with {engine} or on the CPU: "
                f"{type(err).__name__}: {err}",
                index=index,
                key=key,
            ) from (cause or err)
    return torch.stack(out).to(device)


class FallbackEngine:
    """The engine in use, and what replaces it when it fails (see module doc).

    Args:
        first: the engine to use first.
        rest: ``(name, maker)`` of the next engines, tried in order, each made only
            when the one before it has failed (a maker that raises is skipped, logged).
        last: the engine that cannot fail for the engine's sake (`CpuEngine`).
    """

    def __init__(
        self,
        first: Any,
        rest: Sequence[tuple[str, Callable[[], Any]]],
        last: Any,
    ):
        self.engine = first
        self._rest = list(rest)
        self._last = last
        self.failures: list[str] = []

    @property
    def name(self) -> str:
        """The name of the engine in use (changes when it falls back)."""
        return self.engine.name

    @property
    def cpu_only(self) -> bool:
        """Whether every GPU engine has failed: the CPU workers should prepare everything."""
        return bool(getattr(self.engine, "cpu_only", False))

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        while True:
            try:
                return self.engine(encoded, device)
            except EngineError as exc:
                self._fall_back(exc)

    def submit(self, encoded: dict[str, torch.Tensor], device: torch.device) -> Any:
        """Start preparing ``encoded`` (engines that pipeline batches overlap them); a handle."""
        submit = getattr(self.engine, "submit", None)
        if submit is None:
            return (encoded, device, None)
        try:
            return (encoded, device, (self.engine, submit(encoded, device)))
        except EngineError as exc:
            self._fall_back(exc)
            return (encoded, device, None)

    def finish(self, handle: Any) -> torch.Tensor:
        """The images of a batch `submit` started, in order of submission."""
        encoded, device, started = handle
        if started is not None and started[0] is self.engine:
            try:
                return self.engine.finish(started[1])
            except EngineError as exc:
                self._fall_back(exc)
        return self(encoded, device)  # not started, or by an engine that has failed since

    def timings(self) -> dict[str, float]:
        """The engine in use's own host timings (DALI: feed and output wait per batch)."""
        timings = getattr(self.engine, "timings", None)
        return timings() if timings is not None else {}

    def retune(self, setting: Any) -> bool:
        """Apply decoder settings (`unstall.gpu.tune.Setting`) to the engine in use; False
        where it has none (it fell back from DALI)."""
        retune = getattr(self.engine, "retune", None)
        if retune is None:
            return False
        retune(hw_decoder_load=setting.hw_decoder_load, num_threads=setting.threads)
        return True

    def settings(self) -> dict[str, Any]:
        """The engine in use's decoder settings (empty where it has none)."""
        settings = getattr(self.engine, "settings", None)
        return settings() if settings is not None else {}

    def _fall_back(self, exc: EngineError) -> None:
        failed = self.engine.name
        root = exc.__cause__ or exc
        cause = " ".join(f"{type(root).__name__}: {root}".split())[:300]  # one line
        with contextlib.suppress(Exception):  # a broken engine may not close: dropped anyway
            self.engine.close()
        skipped = []
        while self._rest:
            name, make = self._rest.pop(0)
            try:
                self.engine = make()
                break
            except Exception as err:
                skipped.append(f"{name}: {type(err).__name__}: {str(err)[:120]}")
        else:
            self.engine = self._last
        self.failures.append(f"{failed}: {cause}")
        log.warning(
            "GPU stage: %s failed (%s): preparing with %s from now on%s",
            failed,
            cause,
            self.engine.name,
            f" (not usable: {'; '.join(skipped)})" if skipped else "",
        )

    def close(self) -> None:
        """Release the engine in use."""
        self.engine.close()
