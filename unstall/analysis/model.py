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

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

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
class Rates:
    """What the measurements say about this job [Unit: samples/s, second, byte].

    Attributes:
        ingestion: G, the model's own rate (synthetic run).
        prep_cpu_s: CPU seconds a worker spends preparing one sample.
        cores: cores the loader's workers can use on this machine.
        sample_bytes: mean bytes fetched per sample.
        bandwidth: storage throughput B, all readers together [byte/s].
        latency_s: storage time per request L.
        main_cpu_s: CPU seconds per sample of the loader's own work in the training loop
            (unpacking, hand-off): one thread, so it caps the rate at ``1 / main_cpu_s``.
        cache_read_s: seconds to read one sample from the cache.
        proc_cpu_s: CPU seconds per sample of the whole training process (the loop, the
            model's host work, pin-memory thread): it takes cores from the workers, so
            workers and process together cap the rate at ``cores / (prep_cpu_s + proc_cpu_s)``.
    """

    ingestion: float
    prep_cpu_s: float
    cores: float
    sample_bytes: float
    bandwidth: float
    latency_s: float
    main_cpu_s: float = 0.0
    cache_read_s: float = 0.0
    proc_cpu_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}


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
    """

    workers: int
    batch_size: int
    cache: float = 0.0
    noevict: bool = True
    inflight: int = 1
    prefetch: bool = False
    bandwidth: float | None = None
    latency_s: float | None = None

    def label(self) -> str:
        parts = [f"workers={self.workers}", f"cache={self.cache:g}"]
        if self.bandwidth is not None:
            parts.append(f"bandwidth={self.bandwidth / 1e6:g}MB/s")
        if self.latency_s is not None:
            parts.append(f"latency={self.latency_s * 1e3:g}ms")
        if self.inflight != 1:
            parts.append(f"inflight={self.inflight}")
        return ",".join(parts)


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
    b = config.batch_size
    misses = (1.0 - hit) * b
    bandwidth = config.bandwidth or rates.bandwidth
    latency = rates.latency_s if config.latency_s is None else config.latency_s
    rounds = math.ceil(misses / max(config.inflight, 1) - 1e-9) if misses > 1e-9 else 0
    return rounds * latency + misses * rates.sample_bytes / bandwidth + b * rates.cache_read_s


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
    if rates.proc_cpu_s > 0 and rates.cores > 0:  # cores shared by workers and the process
        caps["cores"] = rates.cores / (rates.prep_cpu_s + rates.proc_cpu_s)
    bound = min(caps, key=lambda k: caps[k])
    named = {
        "workers": "fetch" if fetch_batch >= prep_batch else "prep",
        "main": "prep",
        "cores": "prep",
    }
    return Prediction(caps[bound], caps, named.get(bound, bound), hit)


def parse_what_if(text: str, base: Config) -> Config:
    """``"cache=0.5,workers=8,bandwidth=200MB/s,latency=20ms,inflight=64"`` applied to ``base``."""
    changes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        if not sep or not value:
            raise ValueError(f"--what-if part {part!r} must be KEY=VALUE (e.g. workers=8)")
        try:
            if key == "workers":
                changes["workers"] = int(value)
            elif key == "cache":
                changes["cache"] = float(value)
            elif key == "inflight":
                changes["inflight"] = int(value)
            elif key == "bandwidth":
                changes["bandwidth"] = _bytes_per_s(value)
            elif key == "latency":
                changes["latency_s"] = _seconds(value)
            elif key in ("remedies", "unstall"):
                on = value in ("on", "1", "true", "yes")
                changes.update(noevict=on, prefetch=on)
                if not on:
                    changes["inflight"] = 1
            else:
                raise ValueError(
                    f"--what-if key {key!r} is unknown; use workers, cache, bandwidth, "
                    "latency, inflight or remedies"
                )
        except ValueError as exc:
            if "unknown" in str(exc):
                raise
            raise ValueError(f"--what-if {part!r}: cannot read {value!r}: {exc}") from exc
    out = replace(base, **changes)
    if out.workers < 0 or not 0 <= out.cache <= 1 or out.inflight < 1:
        raise ValueError(f"--what-if {text!r}: need workers >= 0, 0 <= cache <= 1, inflight >= 1")
    return out


def _bytes_per_s(value: str) -> float:
    units = {"gb/s": 1e9, "mb/s": 1e6, "kb/s": 1e3, "b/s": 1.0}
    for unit, scale in units.items():
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    return float(value) * 1e6  # plain number: MB/s


def _seconds(value: str) -> float:
    if value.endswith("ms"):
        return float(value[:-2]) / 1e3
    if value.endswith("s"):
        return float(value[:-1])
    return float(value) / 1e3  # plain number: ms


def prep_capacity(rates: Rates, config: Config) -> float:
    """Samples/s the workers can prepare on the cores they share with the training process:
    the model's caps with the model and storage taken away (P)."""
    free = replace(rates, ingestion=math.inf, latency_s=0.0, bandwidth=math.inf)
    return predict(free, replace(config, cache=0.0)).samples_per_s
