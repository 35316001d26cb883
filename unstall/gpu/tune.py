"""DALI's decoder settings chosen by measurement: the hardware decoder's share and its threads.

DALI splits each batch between the GPU's hardware JPEG engines (``hw_decoder_load``)
and nvJPEG's CUDA decoder, whose Huffman stage runs on DALI's CPU threads. Which split
and how many threads are fastest depends on the GPU, the images and what the CPU
workers leave free: DALI's Hopper test runs 70 threads with a share of 0.12, MLPerf's
DGX H100 setup 6 threads and 0.99, and an H100 run measured ResNet-18's rate rising
from 8,056 to 9,673/s as the share went from 0.65 to 1.0 (DESIGN.md section 8).
So `DecoderTuner` measures, the autotuner's way: the GPU stage's rate over a window
of batches with the settings in use, then one neighbouring setting (threads doubled
or halved, the share one step up or down, or both the way they trade), kept when it
pays (its rate at least ``pays`` above), else dropped; from a kept setting its
untried neighbours are tried, until none pays or ``max_trials`` were tried, and it
ends on the best setting measured. The first ``settle`` batches after a change, and
at the start, are not counted (they were fed before it, and a pipeline's build is
paid once: counted, it made the start look slow and every neighbour pay).
`HybridPrep` gives it each batch's engine time (CUDA events) and applies what it
returns with ``engine.retune``; `plugin` starts one where DALI runs the ``mixed``
decoder on a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("unstall")

#: The hardware decoder's shares tried, in order (neighbours are adjacent ones).
LOADS = (1.0, 0.9, 0.75, 0.5, 0.25)


@dataclass(frozen=True)
class Setting:
    """One choice of DALI's decoder settings."""

    hw_decoder_load: float
    threads: int


class DecoderTuner:
    """Tries neighbouring decoder settings and keeps what pays (see module doc).

    Args:
        start: the settings the engine runs with now.
        max_threads: most DALI threads to try (the CPU workers need the rest).
        window: batches measured per setting.
        settle: batches not counted after a change.
        pays: how much faster a setting must be to be kept (0.05: 5 %).
        max_trials: settings tried at most besides the start.
        loads: the hardware decoder's shares that may be tried.
    """

    def __init__(
        self,
        start: Setting,
        *,
        max_threads: int,
        window: int = 8,
        settle: int = 3,
        pays: float = 0.05,
        max_trials: int = 8,
        loads: tuple[float, ...] = LOADS,
    ):
        if window < 1 or settle < 0 or max_trials < 0 or max_threads < 1:
            raise ValueError(
                f"window={window}, settle={settle}, max_trials={max_trials}, "
                f"max_threads={max_threads}: need window >= 1, settle >= 0, max_trials >= 0, "
                "max_threads >= 1"
            )
        self.max_threads = max_threads
        self.window, self.settle, self.pays = window, settle, pays
        self.max_trials = max_trials
        self.loads = tuple(sorted({*loads, start.hw_decoder_load}, reverse=True))
        self.current = self.kept = start
        self.kept_rate: float | None = None
        self.rates: dict[Setting, float] = {}  # every setting measured: samples/s
        self.trials = 0
        self.done = False
        # batches still to skip: after a change, and at the start (the pipeline's build and
        # first batches: an H200's first window read 778/s where the setting runs ~28,800/s)
        self._skip = settle
        self._samples = 0
        self._seconds = 0.0
        self._batches = 0

    def observe(self, samples: int, seconds: float) -> Setting | None:
        """One batch of ``samples`` the engine prepared in ``seconds``; the setting to switch
        to from the next batch on, or None to keep the current one."""
        if self.done or samples <= 0:
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        self._samples += samples
        self._seconds += max(seconds, 0.0)
        self._batches += 1
        if self._batches < self.window:
            return None
        rate = self._samples / max(self._seconds, 1e-12)
        self._samples, self._seconds, self._batches = 0, 0.0, 0
        self.rates[self.current] = rate
        if self.kept_rate is None:  # the start, measured
            self.kept_rate = rate
        elif self.current != self.kept and rate >= self.kept_rate * (1 + self.pays):
            log.info(
                "GPU stage: DALI %s decodes %.0f img/s (%s: %.0f): kept",
                _said(self.current),
                rate,
                _said(self.kept),
                self.kept_rate,
            )
            self.kept, self.kept_rate = self.current, rate
        return self._next()

    def _next(self) -> Setting | None:
        """The next setting to try, or the kept one to go back to (then done)."""
        untried = [s for s in self._neighbours(self.kept) if s not in self.rates]
        if untried and self.trials < self.max_trials:
            self.trials += 1
            return self._switch(untried[0])
        self.done = True
        if self.current != self.kept:
            return self._switch(self.kept)
        return None

    def _switch(self, setting: Setting) -> Setting:
        self.current = setting
        self._skip = self.settle
        return setting

    def _neighbours(self, s: Setting) -> list[Setting]:
        """Threads doubled, the share a step down or up, threads halved; then both at once the
        way they trade (more threads for nvJPEG's share as the hardware's share drops)."""
        i, load = self.loads.index(s.hw_decoder_load), s.hw_decoder_load
        more = s.threads * 2 if s.threads * 2 <= self.max_threads else None
        fewer = max(1, s.threads // 2) if s.threads > 1 else None
        lower = self.loads[i + 1] if i + 1 < len(self.loads) else None
        higher = self.loads[i - 1] if i > 0 else None
        pairs = [(load, more), (lower, s.threads), (higher, s.threads), (load, fewer)]
        pairs += [(lower, more), (higher, fewer)]
        return [Setting(a, t) for a, t in pairs if a is not None and t is not None]

    def summary(self) -> dict[str, Any]:
        """What was measured and chosen (the ``prep`` section of ``loader.stats()``)."""
        return {
            "decoder_tuning": "done" if self.done else "measuring",
            "decoder_rates": [
                {"hw_decoder_load": s.hw_decoder_load, "threads": s.threads, "per_s": round(r, 1)}
                for s, r in self.rates.items()
            ],
            "decoder_chosen": {"hw_decoder_load": self.kept.hw_decoder_load,
                               "threads": self.kept.threads},
        }  # fmt: skip


def _said(s: Setting) -> str:
    return f"hw_decoder_load={s.hw_decoder_load:g}, {s.threads} threads"
