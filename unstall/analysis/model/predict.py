"""The what-if model: samples/s of a loader configuration from measured rates.

DESIGN.md section 1: a pipelined step runs at ``min(G, P, F)``. We refine each
term with what the measurements give (ANALYZER.md: beat DS-Analyzer's
cache-only model): P from CPU seconds per sample and the cores the workers can
use; F from a storage of aggregate bandwidth ``B`` and per-request latency
``L`` with ``q`` requests in flight per worker (Little's law), with the cache's
hit rate ``h`` taking its share off storage; and a worker's own serial path:
without prefetching a worker fetches *then* prepares each batch, so
``W * b / (T_fetch + T_prep)`` caps the rate too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from unstall.analysis.rates.result import Rates

#: LRU (page cache) hit rate under per-epoch shuffling, by cache/dataset (DESIGN.md section 2).
_LRU_POINTS = ((0.0, 0.0), (0.1, 0.006), (0.25, 0.034), (0.5, 0.154), (0.75, 0.406))
_LRU_POINTS += ((0.9, 0.67), (1.0, 1.0))


def lru_hit_rate(fraction: float) -> float:
    """Hit rate of an LRU cache holding ``fraction`` of a dataset read in a new order each epoch."""
    xs, ys = zip(*_LRU_POINTS, strict=True)
    return float(np.interp(min(max(fraction, 0.0), 1.0), xs, ys))


def hit_rate(fraction: float, *, noevict: bool) -> float:
    """No-eviction (unstall's `Cache`) reaches C/N exactly; the page cache's LRU far less."""
    fraction = min(max(fraction, 0.0), 1.0)
    return fraction if noevict else lru_hit_rate(fraction)


@dataclass(frozen=True)
class Config:
    """One loader configuration to predict.

    Attributes:
        workers: loader worker processes.
        batch_size: samples per batch.
        cache: fraction of the dataset the cache holds (0: none).
        noevict: unstall's no-eviction cache (True) or the page cache's LRU.
        inflight: requests in flight per worker (``batch_size`` for stores that fetch a
            batch in one call; 1 for torch's one read per ``__getitem__``).
        prefetch: a worker fetches its next batch while it prepares this one.
        bandwidth, latency_s: storage, overriding the measured values when set.
        prefetch_factor: batches torch keeps in flight per worker (its in-order delivery
            holds a worker that far ahead of the batch the loop waits for: `in_order_share`).
    """

    workers: int
    batch_size: int
    cache: float = 0.0
    noevict: bool = True
    inflight: int = 1
    prefetch: bool = False
    bandwidth: float | None = None
    latency_s: float | None = None
    prefetch_factor: int = 2

    def label(self) -> str:
        parts = [f"workers={self.workers}", f"cache={self.cache:g}"]
        if self.bandwidth is not None:
            parts.append(f"bandwidth={self.bandwidth / 1e6:g}MB/s")
        if self.latency_s is not None:
            parts.append(f"latency={self.latency_s * 1e3:g}ms")
        if self.inflight != 1:
            parts.append(f"inflight={self.inflight}")
        return ",".join(parts)

    @classmethod
    def of_job(cls, m: Any) -> Config:
        """The measured job's own configuration (``m``: a `Measurement`): its workers and
        batch size, and the requests in flight its storage probe saw."""
        inflight = m.probe.inflight if m.probe is not None else 1
        cold = (getattr(m, "docs", None) or {}).get("cold") or {}
        return cls(
            workers=m.num_workers,
            batch_size=m.batch_size,
            inflight=inflight,
            prefetch=inflight > 1 and inflight != m.batch_size,
            prefetch_factor=int(cold.get("prefetch_factor") or 2),
        )


@dataclass(frozen=True)
class Prediction:
    """Predicted samples/s, each cap on it, and which one binds."""

    samples_per_s: float
    caps: dict[str, float]
    bound: str
    hit_rate: float

    def epoch_s(self, num_samples: int) -> float:
        return num_samples / self.samples_per_s if self.samples_per_s > 0 else math.inf


def fetch_seconds_per_batch(rates: Rates, config: Config, hit: float) -> float:
    """One worker's time to fetch a batch: misses go to storage in rounds of ``inflight``."""
    return rates.batch_fetch_s(
        config.batch_size,
        config.inflight,
        hit,
        bandwidth=config.bandwidth,
        latency_s=config.latency_s,
    )


def predict(rates: Rates, config: Config) -> Prediction:
    """Samples/s of ``config``: the least of the model, the cores, storage, each worker's own
    fetch-then-prepare path, and the main process."""
    hit = hit_rate(config.cache, noevict=config.noevict)
    b, w = config.batch_size, max(config.workers, 1)
    bandwidth = config.bandwidth or rates.bandwidth
    share = max(1.0, w / rates.cores) if rates.cores > 0 else 1.0  # workers sharing a core
    prep_batch = b * rates.prep_cpu_s * share
    fetch_batch = fetch_seconds_per_batch(rates, config, hit)
    per_worker = max(fetch_batch, prep_batch) if config.prefetch else fetch_batch + prep_batch
    caps: dict[str, float] = {
        "compute": rates.ingestion,
        "prep": min(float(w), rates.cores) / rates.prep_cpu_s if rates.prep_cpu_s > 0 else math.inf,
        "fetch": bandwidth / ((1.0 - hit) * rates.sample_bytes) if hit < 1 else math.inf,
        "workers": w * b / per_worker if per_worker > 0 else math.inf,
    }
    if rates.main_cpu_s > 0:
        caps["main"] = 1.0 / rates.main_cpu_s
    process = rates.process_cpu_s  # the process's own CPU and its receive of each batch
    if process > 0 and rates.cores > 0:  # cores shared by workers and the process
        caps["cores"] = rates.cores / (rates.prep_cpu_s + process)
    if rates.batch_cv > 0 and w > 1:  # in-order delivery: a worker held by a late batch
        step = b / min(caps["compute"], caps.get("main", math.inf))
        kept = in_order_share(w, config.prefetch_factor, rates.batch_cv, step / per_worker)
        for k in ("prep", "workers", "cores"):
            if k in caps:
                caps[k] *= kept
    if rates.loop_runq_s > 0 and 0 < rates.ingestion < math.inf:
        rest = min(v for k, v in caps.items() if k != "compute")
        for _ in range(4):  # the wait depends on the rate it caps: a few rounds settle it
            caps["compute"] = loop_cap(rates, min(rest, caps["compute"]))
    bound = min(caps, key=lambda k: caps[k])
    named = {
        "workers": "fetch" if fetch_batch >= prep_batch else "prep",
        "main": "prep",
        "cores": "prep",
    }
    return Prediction(caps[bound], caps, named.get(bound, bound), hit)


#: The loop's wait for a core is priced at most this many times its measured size (a
#: configuration whose workers keep the cores far busier than the measured job's).
RUNQ_SCALE_MAX = 4.0


def loop_cap(rates: Rates, rate: float) -> float:
    """G as the training loop runs beside the workers at ``rate`` samples/s: each step also
    waits for a core while a worker holds it (`Rates.loop_runq_s`, measured), in proportion
    to the cores the workers keep busy (``rate * prep_cpu_s``) against the measured job's.

    Without it the model was 12-18 % optimistic on one core (a job at G = 392/s with a
    node cache re-ran at 334-344/s: the loop waited 2.5-3 ms for the core in each 20 ms
    step); on two cores the wait is ~0.5 ms a step.
    """
    wait = rates.loop_runq_s
    if rates.loop_runq_load > 0 and rates.cores > 0:
        then = _queued(rates.loop_runq_load / rates.cores)
        now = _queued(rate * rates.prep_cpu_s / rates.cores)
        wait *= min(RUNQ_SCALE_MAX, now / then) if then > 0 else 1.0
    return 1.0 / (1.0 / rates.ingestion + wait)


def _queued(busy: float) -> float:
    """A queue's mean length at a server busy ``busy`` of its time (``rho / (1 - rho)``):
    the loop finds more workers ahead of it as the workers' share of the cores grows."""
    busy = min(max(busy, 0.0), 0.95)
    return busy / (1.0 - busy)


def prep_capacity(rates: Rates, config: Config) -> float:
    """Samples/s the workers can prepare on the cores they share with the training process:
    the model's caps with the model and storage taken away (P)."""
    free = replace(rates, ingestion=math.inf, latency_s=0.0, bandwidth=math.inf)
    return predict(free, replace(config, cache=0.0)).samples_per_s


def per_worker_rate(rates: Rates, base: Config) -> float:
    """Samples/s one worker delivers by its measured time per sample (CPU + I/O), alone."""
    per_sample = rates.prep_cpu_s + fetch_seconds_per_batch(rates, base, 0.0) / max(
        1, base.batch_size
    )
    return 1.0 / per_sample if per_sample > 0 else 0.0


#: Batches the in-order simulation runs (`in_order_share`), and its fixed seed.
IN_ORDER_BATCHES = 4000
IN_ORDER_SEED = 58


def in_order_share(workers: int, prefetch: int, cv: float, step: float) -> float:
    """The share of the workers' own rate left under torch's in-order delivery, for batch
    times of coefficient of variation ``cv`` and the loop's step per batch ``step`` (in a
    worker's mean batch time).

    torch hands batch k to worker ``k % workers`` and sends task ``k + workers * prefetch``
    only when the loop has taken batch k: a worker that has finished its ``prefetch``
    batches waits while another worker's earlier batch is late, and its core stands idle.
    Steady batch times lose nothing; the more they vary, the more (``cv`` 0.3 keeps 97 %,
    0.62 keeps 90 % at 2 workers x prefetch 2). Simulated exactly as torch schedules, over
    `IN_ORDER_BATCHES` gamma-distributed batch times (a fixed seed: the same inputs give
    the same price). It applies to every configuration with two workers or more, so it is
    priced here, from ``rates.batch_cv`` where a measurement gives it (0: not priced).
    Measured on the audio example's sample cache (2 workers, 2 cores, batches of 17-40 ms,
    the machine loaded by others: load 5-11), the verification's timeline
    (`unstall.analysis.rates.in_order`) showed batch-time ``cv`` 0.31/0.43/0.49/0.69 and the
    workers waiting 2.4/9.9/8.6/6.3 % of their time on the in-order delivery; this prices
    3.3/5.8/7.1/11.8 % at those ``cv``: right on average, not run by run.
    """
    return _in_order_share(
        max(1, int(workers)), max(1, int(prefetch)), round(cv, 2), round(max(step, 0.0), 2)
    )


@functools.lru_cache(maxsize=256)
def _in_order_share(workers: int, prefetch: int, cv: float, step: float) -> float:
    n = IN_ORDER_BATCHES
    if cv <= 0 or workers == 1:
        return 1.0
    shape = 1.0 / cv**2
    times = np.random.default_rng(IN_ORDER_SEED).gamma(shape, 1.0 / shape, n)
    ahead = workers * prefetch
    free = [0.0] * workers  # when each worker is done with the tasks it holds
    taken = [0.0] * n  # when the loop takes each batch
    last = -step
    for k in range(n):
        sent = taken[k - ahead] if k >= ahead else 0.0
        w = k % workers
        free[w] = max(free[w], sent) + float(times[k])
        last = taken[k] = max(free[w], last + step)
    rate = n / taken[-1]
    alone = min(workers / float(times.mean()), 1.0 / step if step > 0 else math.inf)
    return min(1.0, rate / alone)
