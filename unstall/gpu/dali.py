"""NVIDIA DALI as the GPU stage's engine: decode + crop + resize + flip + normalize per batch.

unstall's workers keep producing the encoded bytes (caches, object stores, exact
order, coordinated prep unchanged) and draw each sample's crop box and flip by
unstall's per-batch seeding; a DALI pipeline fed through ``fn.external_source``
takes the bytes *and* those boxes and flips as inputs (nothing is drawn by DALI):
``decoders.image_slice`` decodes only the crop window (``mixed``: the hardware
JPEG engines with ``hw_decoder_load=1.0``, nvJPEG for the rest), ``resize``
(bilinear, antialiased like the CPU path) and ``crop_mirror_normalize`` (flip,
normalize, CHW) finish it. The calling thread only packs a few arrays per batch;
DALI's threads run without the GIL and its kernels on its own streams in this
process's CUDA context. Without a GPU (``device="cpu"``) the same graph runs on
DALI's CPU backend, so CI tests this plumbing. ``pip install 'unstall[dali]'``.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from unstall.errors import SampleError
from unstall.gpu.prep import ENCODED

log = logging.getLogger("unstall")

_live: weakref.WeakSet[DaliEngine] = weakref.WeakSet()
_orphans: list[Any] = []  # pipelines a forked child inherited: never destroyed there


def _after_fork_in_child() -> None:
    """A forked worker inherits the parent's engines but not DALI's threads: destroying a
    pipeline there waits forever for them (seen: a worker's gc finalizing a dead loader).
    Keep them referenced; workers end with ``os._exit``, so no destructor ever runs."""
    for engine in list(_live):
        if engine._pipe is not None:
            _orphans.append(engine._pipe)


os.register_at_fork(after_in_child=_after_fork_in_child)


class DaliEngine:
    """Prepares encoded batches with a DALI pipeline built on first use (see module doc).

    Args:
        pipeline: the dataset's `ImagePipeline` (size, mean, std; its boxes come with the batch).
        device: where the images go: CUDA (``mixed`` decode) or CPU (DALI's CPU backend).
        batch_size: most samples one call prepares.
        key_of: sample index -> key, to name a sample neither DALI nor the CPU can decode.
        hw_decoder_load: share of each batch DALI sends to the hardware JPEG engines
            (H100, A100); measured best at 1.0 on an H100 (DESIGN.md section 8).
        num_threads: DALI's CPU threads (parsing, host-side decode work).
        fancy_upsampling: chroma upsampling as libjpeg-turbo's (the CPU path's) in the
            ``mixed`` decoder too. Off by default, as in DALI and in the H100 runs of
            DESIGN.md section 8 (whether it slows the hardware decoder is not measured
            yet); the CPU backend upsamples that way regardless.
    """

    def __init__(
        self,
        pipeline: Any,
        device: torch.device,
        *,
        batch_size: int,
        key_of: Callable[[int], str],
        hw_decoder_load: float = 1.0,
        num_threads: int | None = None,
        fancy_upsampling: bool = False,
    ):
        import nvidia.dali  # type: ignore[import-not-found]  # fail early when missing

        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        self.device = device
        self.cuda = device.type == "cuda"
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.batch_size = batch_size
        self.key_of = key_of
        self.hw_decoder_load = hw_decoder_load
        self.fancy_upsampling = fancy_upsampling
        self.num_threads = num_threads or (4 if self.cuda else 1)
        where = "mixed: hardware JPEG decoder, else nvJPEG" if self.cuda else "CPU backend"
        self.name = f"DALI {nvidia.dali.__version__} ({where})"
        self._pipeline = pipeline
        self._pipe: Any = None
        self._inputs: list[np.ndarray] = []
        self.rejected_batches = 0
        _live.add(self)

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        offsets = encoded["offsets"].numpy()
        n = len(offsets) - 1
        if n > self.batch_size:
            raise ValueError(
                f"{n} encoded samples exceed this engine's batch_size={self.batch_size}"
            )
        pipe = self._pipe if self._pipe is not None else self._build()
        boxes = encoded["boxes"].numpy().astype(np.float32)
        # no_copy: DALI reads the batch's own memory; kept referenced until the next call
        self._inputs = np.split(encoded[ENCODED].numpy(), offsets[1:-1])
        pipe.feed_input("jpegs", self._inputs)
        pipe.feed_input("anchor", np.ascontiguousarray(boxes[:, :2]))  # (x, y)
        pipe.feed_input("shape", np.ascontiguousarray(boxes[:, 2:]))  # (width, height)
        pipe.feed_input("mirror", encoded["flips"].numpy().astype(np.int32))
        try:
            (out,) = pipe.run()
        except RuntimeError as exc:  # one image DALI cannot decode fails the whole batch
            return self._on_cpu(encoded, device, exc)
        return self._to_torch(out, n, device)

    def close(self) -> None:
        """Drop the DALI pipeline (its threads and device buffers go with it)."""
        self._pipe = None
        self._inputs = []

    def _build(self) -> Any:
        from nvidia.dali import fn, pipeline_def, types  # type: ignore[import-not-found]

        decode_on = "mixed" if self.cuda else "cpu"
        height, width = self.size
        mean = [255.0 * m for m in self.mean]
        std = [255.0 * s for s in self.std]
        hints = {"hw_decoder_load": self.hw_decoder_load} if self.cuda else {}

        @pipeline_def(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=(self.device.index or 0) if self.cuda else None,
            exec_dynamic=True,
            prefetch_queue_depth=1,
        )
        def graph() -> Any:
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1, no_copy=True)
            anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
            mirror = fn.external_source(name="mirror", dtype=types.INT32, ndim=0)
            images = fn.decoders.image_slice(
                jpegs,
                anchor,
                shape,
                device=decode_on,
                normalized_anchor=False,
                normalized_shape=False,
                output_type=types.RGB,
                jpeg_fancy_upsampling=self.fancy_upsampling,
                **hints,
            )
            images = fn.resize(
                images,
                resize_x=width,
                resize_y=height,
                antialias=True,
                interp_type=types.INTERP_LINEAR,
            )
            return fn.crop_mirror_normalize(
                images, mirror=mirror, mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW"
            )

        self._pipe = graph()
        self._pipe.build()
        return self._pipe

    def _to_torch(self, out: Any, n: int, device: torch.device) -> torch.Tensor:
        if not self.cuda:
            return torch.from_numpy(np.array(out.as_array())).to(device)
        from nvidia.dali.plugin.pytorch import feed_ndarray  # type: ignore[import-not-found]

        images = torch.empty((n, 3, *self.size), dtype=torch.float32, device=device)
        feed_ndarray(out.as_tensor(), images, cuda_stream=torch.cuda.current_stream(device))
        return images

    def _on_cpu(
        self, encoded: dict[str, torch.Tensor], device: torch.device, exc: Exception
    ) -> torch.Tensor:
        """The batch DALI rejected, prepared on this thread's CPU; a sample neither decodes
        is named in a `SampleError`. Rare: the workers send CMYK and non-JPEG files to the
        CPU side already."""
        self.rejected_batches += 1
        float_pipe = self._float_pipeline()
        data, bounds = encoded[ENCODED].numpy(), encoded["offsets"].tolist()
        boxes, flips = encoded["boxes"].tolist(), encoded["flips"].tolist()
        out = []
        for i, index in enumerate(encoded["indices"].tolist()):
            raw = data[bounds[i] : bounds[i + 1]].tobytes()
            try:
                out.append(float_pipe.apply(raw, tuple(boxes[i]), flip=bool(flips[i])))
            except Exception as err:
                key = self.key_of(index)
                raise SampleError(
                    f"cannot decode sample {index} (key {key!r}) with {self.name} or on the CPU: "
                    f"{type(err).__name__}: {err}",
                    index=index,
                    key=key,
                ) from exc
        log.warning(
            "%s rejected a batch of %d (%s): prepared it on the CPU",
            self.name,
            len(out),
            str(exc).splitlines()[0][:120],
        )
        return torch.stack(out).to(device)

    def _float_pipeline(self) -> Any:
        import copy

        pipe = copy.copy(self._pipeline)
        pipe.output = "float"
        return pipe
