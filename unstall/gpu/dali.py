"""NVIDIA DALI as the GPU stage's engine: decode + crop + resize + flip + normalize per batch.

unstall's workers keep producing the encoded bytes (caches, object stores, exact
order, coordinated prep unchanged) and draw each sample's crop box and flip by
unstall's per-batch seeding; a DALI pipeline fed through ``fn.external_source``
takes the bytes *and* those boxes and flips as inputs (nothing is drawn by DALI):
``decoders.image_slice`` decodes only the crop window (``mixed``: the hardware
JPEG engines for ``hw_decoder_load`` of each batch, nvJPEG for the rest; `retune`
changes the share and DALI's threads as `unstall.gpu.tune` measures what pays),
``resize`` (bilinear, antialiased like the CPU path) and ``crop_mirror_normalize``
(flip, normalize, CHW) finish it. The calling thread (the GPU stage's, never the
training loop's) hands DALI two inputs per batch (`unstall.gpu.dali_feed`: the bytes
in place, one DALI tensor per sample made in C++); DALI's threads run without the
GIL and its kernels on its own streams in this process's CUDA context. Without a GPU
(``device="cpu"``) the same graph runs on DALI's CPU backend, so CI tests this
plumbing. ``pip install 'unstall[dali]'``
(CUDA 13) or ``'unstall[dali-cu12]'`` (CUDA 12).

Same pixels as the CPU path (`unstall.pipeline.decode`, libjpeg-turbo): EXIF
orientation is *not* applied (``adjust_orientation=False``; the CPU path and the
torch engine never rotate, and the crop boxes are drawn on the stored size),
chroma is upsampled as libjpeg-turbo does (``jpeg_fancy_upsampling``), the IDCT
is the accurate one, grey and CMYK files come out as RGB, and the resize is
bilinear with antialiasing. One difference is left: the CPU path decodes at a
1/2, 1/4 or 1/8 DCT scale where the crop is at least twice the output size, DALI
at full size (1-2 grey levels apart on such crops).

Pipelined: ``prefetch`` (>= 2) iterations are in flight, so `submit` can feed the
next batch while DALI still prepares this one (`finish` takes them in order); the
outputs are bound to the caller's CUDA stream, so the host never waits for the GPU.
An engine failure (a pipeline that does not build, one that dies before its first
batch, or on two batches in a row) raises `EngineError` for `FallbackEngine`; a
batch DALI rejects now and then (one file it cannot decode) is prepared on the CPU.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from unstall.gpu import dali_feed
from unstall.gpu.fallback import EngineError, prepare_on_cpu

log = logging.getLogger("unstall")

_live: weakref.WeakSet[DaliEngine] = weakref.WeakSet()
_orphans: list[Any] = []  # pipelines a forked child inherited: never destroyed there


def _after_fork_in_child() -> None:
    """A forked worker inherits the parent's engines but not DALI's threads: destroying a
    pipeline there waits forever for them (seen: a worker's gc finalizing a dead loader).
    Keep them referenced; workers end with ``os._exit``, so no destructor ever runs."""
    for engine in list(_live):
        runs = [*engine._draining, *([engine._run] if engine._run is not None else [])]
        _orphans.extend(run.pipe for run in runs if run.pipe is not None)


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Run:
    """One built DALI pipeline and the batches fed to it, in order (retuning builds another)."""

    def __init__(self, pipe: Any, prefetch: int):
        self.pipe = pipe
        self.fed: list[Any] = []  # fed before the first run (which starts `prefetch` at once)
        self.queue: deque[tuple[bool, Any]] = deque()  # (real batch?, its inputs) per iteration
        # no_copy: DALI may read a batch's bytes until `prefetch` iterations after it was fed
        self.retired: deque[Any] = deque(maxlen=prefetch + 1)
        self.started = False
        self.dead = False

    def pending(self) -> int:
        """Batches fed and not yet taken."""
        return len(self.fed) + sum(1 for real, _ in self.queue if real)


@dataclass
class DaliHandle:
    """A batch `DaliEngine.submit` fed: what `finish` needs to return or redo it."""

    encoded: dict[str, torch.Tensor]
    device: torch.device
    n: int
    run: _Run


class DaliEngine:
    """Prepares encoded batches with a DALI pipeline built on first use (see module doc).

    Args:
        pipeline: the dataset's `ImagePipeline` (size, mean, std; its boxes come with the batch).
        device: where the images go: CUDA (``mixed`` decode) or CPU (DALI's CPU backend).
        batch_size: most samples one call prepares.
        key_of: sample index -> key, to name a sample neither DALI nor the CPU can decode.
        hw_decoder_load: share of each batch DALI sends to the hardware JPEG engines
            (H100, A100); `retune` changes it (`unstall.gpu.tune` measures what pays).
        num_threads: DALI's CPU threads (parsing, host-side decode work); `retune` too.
        fancy_upsampling: chroma upsampling as libjpeg-turbo's (the CPU path's) in the
            ``mixed`` decoder too (DALI's CPU backend upsamples that way regardless).
            On by default, for the CPU path's pixels; whether it slows the hardware
            decoder is for ``unstall bench train`` to measure on a GPU.
        prefetch: DALI iterations in flight (``prefetch_queue_depth``), at least 2.
        feed: how the bytes are handed to DALI (`unstall.gpu.dali_feed.FEEDS`).
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
        fancy_upsampling: bool = True,
        prefetch: int = 2,
        feed: str = "tensors",
    ):
        import nvidia.dali  # type: ignore[import-not-found]  # fail early when missing

        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        if prefetch < 2:
            raise ValueError(f"prefetch={prefetch!r} must be >= 2 (batches in flight)")
        if feed not in dali_feed.FEEDS:
            raise ValueError(f"feed={feed!r} must be one of {dali_feed.FEEDS}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.size = pipeline.size
        self.mean, self.std = pipeline.mean, pipeline.std
        self.batch_size = batch_size
        self.key_of = key_of
        self.hw_decoder_load = hw_decoder_load
        self.fancy_upsampling = fancy_upsampling
        self.prefetch = prefetch
        self.feed = feed
        self.num_threads = num_threads or (4 if self.cuda else 1)
        where = "mixed: hardware JPEG decoder, else nvJPEG" if self.cuda else "CPU backend"
        self.name = f"DALI {nvidia.dali.__version__} ({where})"
        self._float = _float_pipeline(pipeline)
        self._run: _Run | None = None  # the pipeline new batches go to
        self._draining: deque[_Run] = deque()  # retuned-away pipelines finishing their batches
        self.produced = 0
        self.rejected_batches = 0
        self.rebuilds = 0
        self._failed_in_row = 0
        # this thread's CPU feeding DALI; wall time and CPU waiting for its outputs [s]
        self.feed_cpu_s = self.wait_s = self.wait_cpu_s = 0.0
        self.copy_cpu_s = 0.0  # of the wait's CPU: copying the output out (a memcpy on a CPU)
        _live.add(self)

    @property
    def _pipe(self) -> Any:
        """The pipeline new batches go to (None before the first batch or after a failure)."""
        return None if self._run is None else self._run.pipe

    def __call__(self, encoded: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        return self.finish(self.submit(encoded, device))

    def submit(self, encoded: dict[str, torch.Tensor], device: torch.device) -> DaliHandle:
        """Feed one encoded batch and let DALI start on it; `finish` returns its images."""
        n = len(encoded["offsets"]) - 1
        if n > self.batch_size:
            raise ValueError(
                f"{n} encoded samples exceed this engine's batch_size={self.batch_size}"
            )
        run = self._run if self._run is not None else self._build()
        c0 = time.thread_time()  # a build is paid once: not the feed's
        try:
            inputs = (dali_feed.batch_inputs(encoded, self.feed), encoded)
            dali_feed.feed(run.pipe, inputs[0])
            if run.started:
                run.pipe.schedule_run()
                run.queue.append((True, inputs))
            else:
                run.fed.append(inputs)
                if len(run.fed) >= self.prefetch:
                    self._start(run)
        except Exception as exc:  # feeding or scheduling broke the pipeline: the engine's own
            self._drop()
            raise EngineError(f"{self.name} failed to run") from exc
        self.feed_cpu_s += time.thread_time() - c0
        return DaliHandle(encoded, device, n, run)

    def finish(self, handle: DaliHandle) -> torch.Tensor:
        """The images of ``handle``'s batch (batches are finished in the order submitted)."""
        run = handle.run
        if run.dead:  # its pipeline failed since: run the batch anew
            return self(handle.encoded, handle.device)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            if not run.started:  # fewer batches than `prefetch` so far
                self._start(run)
            while not run.queue[0][0]:  # padding iterations of the first run
                run.retired.append(run.queue.popleft()[1])
                run.pipe.outputs()
            run.retired.append(run.queue.popleft()[1])
            stream = torch.cuda.current_stream(handle.device) if self.cuda else None
            (out,) = run.pipe.outputs(cuda_stream=stream)
            c1 = time.thread_time()
            images = self._to_torch(out, handle.n, handle.device, stream)
            self.copy_cpu_s += time.thread_time() - c1
        except Exception as exc:  # one image DALI cannot decode fails (and ends) the pipeline
            return self._rejected(handle, exc)
        finally:
            self.wait_s += time.perf_counter() - t0
            self.wait_cpu_s += time.thread_time() - c0
        if run is not self._run and run.pending() == 0:  # a retuned-away pipeline is done
            self._retire(run)
        self.produced += 1
        self._failed_in_row = 0
        return images

    def retune(self, *, hw_decoder_load: float, num_threads: int) -> None:
        """Use these settings from the next batch on: a new pipeline takes new batches while
        the current one finishes those already fed (DALI fixes both when it builds)."""
        if (hw_decoder_load, num_threads) == (self.hw_decoder_load, self.num_threads):
            return
        self.hw_decoder_load, self.num_threads = hw_decoder_load, num_threads
        if self._run is not None:
            if self._run.pending():
                self._draining.append(self._run)
            else:
                self._run.dead = True
            self._run = None
        self.rebuilds += 1

    def settings(self) -> dict[str, Any]:
        """The decoder settings in use (the ``prep`` section of ``loader.stats()``)."""
        load = self.hw_decoder_load if self.cuda else None  # the CPU backend has no engines
        return {"dali_hw_decoder_load": load, "dali_threads": self.num_threads}

    def timings(self) -> dict[str, Any]:
        """Per batch [Unit: ms]: the calling thread's CPU feeding DALI (``dali_feed_cpu``), the
        wall time and CPU it waited for DALI's outputs (``dali_wait``, ``dali_wait_cpu``; of
        which copying them out, ``dali_copy_cpu``); the batches DALI rejected (prepared on
        the CPU), the feed and the decoder settings."""
        batches = max(1, self.produced + self.rejected_batches)
        return {
            "dali_feed_cpu_ms_per_batch": round(1e3 * self.feed_cpu_s / batches, 3),
            "dali_wait_ms_per_batch": round(1e3 * self.wait_s / batches, 3),
            "dali_wait_cpu_ms_per_batch": round(1e3 * self.wait_cpu_s / batches, 3),
            "dali_copy_cpu_ms_per_batch": round(1e3 * self.copy_cpu_s / batches, 3),
            "dali_feed": self.feed,
            "rejected_batches": self.rejected_batches,
            **self.settings(),
        }

    def close(self) -> None:
        """Drop the DALI pipelines (their threads and device buffers go with them)."""
        self._drop()

    def _drop(self) -> None:
        for run in (*self._draining, *([self._run] if self._run is not None else [])):
            self._retire(run)
        self._draining.clear()
        self._run = None

    def _retire(self, run: _Run) -> None:
        run.dead = True
        run.fed.clear()
        run.queue.clear()
        run.retired.clear()
        run.pipe = None
        if run in self._draining:
            self._draining.remove(run)

    def _start(self, run: _Run) -> None:
        """DALI's first run starts `prefetch` iterations: pad with copies of the last batch."""
        padding = self.prefetch - len(run.fed)
        for _ in range(padding):
            dali_feed.feed(run.pipe, run.fed[-1][0])
        run.pipe.schedule_run()
        run.queue.extend((True, inputs) for inputs in run.fed)
        run.queue.extend((False, run.fed[-1]) for _ in range(padding))
        run.fed, run.started = [], True

    def _build(self) -> _Run:
        try:
            pipe = self._graph()
            pipe.build()
        except Exception as exc:  # CUDA/driver/library mismatch: the engine cannot work here
            raise EngineError(f"{self.name}: its pipeline did not build") from exc
        self._run = _Run(pipe, self.prefetch)
        return self._run

    def _graph(self) -> Any:
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
            prefetch_queue_depth=self.prefetch,
        )
        def graph() -> Any:
            jpegs, anchor, shape, mirror = dali_feed.graph_inputs(fn, types)
            images = fn.decoders.image_slice(
                jpegs,
                anchor,
                shape,
                device=decode_on,
                normalized_anchor=False,
                normalized_shape=False,
                output_type=types.RGB,  # grey and CMYK files too, as the CPU path
                dtype=types.UINT8,
                adjust_orientation=False,  # the CPU path never rotates: boxes fit the stored size
                jpeg_fancy_upsampling=self.fancy_upsampling,
                use_fast_idct=False,  # the accurate IDCT, as simplejpeg's default
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

        return graph()

    def _to_torch(self, out: Any, n: int, device: torch.device, stream: Any) -> torch.Tensor:
        return dali_feed.to_torch(out, n, self.size, device, stream)

    def _rejected(self, handle: DaliHandle, exc: Exception) -> torch.Tensor:
        """A batch DALI failed on: the pipeline is gone (rebuilt on the next batch). Before
        any batch worked, or twice in a row, the engine is at fault (`EngineError`); else
        the batch is prepared on this thread's CPU, or a sample neither decodes is named."""
        self._drop()
        self._failed_in_row += 1
        if self.produced == 0 or self._failed_in_row >= 2:
            raise EngineError(f"{self.name} failed to run") from exc
        self.rejected_batches += 1
        images = prepare_on_cpu(
            self._float, handle.encoded, handle.device, self.key_of, self.name, exc
        )
        log.warning(
            "%s rejected a batch of %d (%s): prepared it on the CPU",
            self.name,
            handle.n,
            str(exc).splitlines()[0][:120],
        )
        return images


def _float_pipeline(pipeline: Any) -> Any:
    import copy

    pipe = copy.copy(pipeline)
    pipe.output = "float"
    return pipe
