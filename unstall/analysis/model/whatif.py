"""What-if predictions: a question (``--what-if``), the table over workers and cache sizes,
and the curves against cache size, workers and bandwidth; all from the model's `predict`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unstall.analysis.measure.probe import UNLIMITED
from unstall.analysis.model.predict import Config, predict
from unstall.analysis.rates.result import Rates

CACHE_STEPS = (0.0, 0.25, 0.5, 0.75, 1.0)


def worker_steps(cores: float, current: int) -> list[int]:
    top = max(int(cores) * 2, current, 1)
    steps = sorted({1, 2, 4, 8, 16, 32, 64, current, int(cores), top})
    return [w for w in steps if 1 <= w <= top]


def row(rates: Rates, config: Config, num_samples: int, **extra: Any) -> dict[str, Any]:
    p = predict(rates, config)
    return {
        "config": config.label(),
        "workers": config.workers,
        "cache": config.cache,
        "samples_per_s": round(p.samples_per_s, 1),
        "epoch_s": round(p.epoch_s(num_samples), 2),
        "bound": p.bound,
        "hit_rate": round(p.hit_rate, 4),
        **extra,
    }


def grid(rates: Rates, base: Config, num_samples: int) -> list[dict[str, Any]]:
    """The default what-if table: workers x cache sizes at the measured storage."""
    # a plain dataset (no raw bytes to keep) cannot use unstall's cache: workers only
    caches = CACHE_STEPS if rates.sample_bytes > 1.0 else (0.0,)
    return [
        row(rates, replace(base, workers=w, cache=c), num_samples)
        for w in worker_steps(rates.cores, base.workers)
        for c in caches
    ]


def curves(rates: Rates, base: Config, num_samples: int, delivered: float) -> dict[str, Any]:
    """Throughput against cache size (unstall's vs the page cache's), workers, bandwidth."""
    fractions = [i / 20 for i in range(21)]
    out: dict[str, Any] = {
        "cache": {
            "x": fractions,
            "unstall": [predict(rates, replace(base, cache=f)).samples_per_s for f in fractions],
            "page_cache": [
                predict(rates, replace(base, cache=f, noevict=False)).samples_per_s
                for f in fractions
            ],
        }
    }
    workers = list(range(1, max(2 * int(rates.cores), base.workers, 2) + 1))
    out["workers"] = {
        "x": workers,
        "y": [predict(rates, replace(base, workers=w)).samples_per_s for w in workers],
    }
    # around the measured bandwidth; storage with no visible limit: around what it delivered
    b0 = rates.bandwidth if rates.bandwidth < UNLIMITED else delivered * rates.sample_bytes
    scales = [0.25, 0.5, 1, 2, 4, 8]
    if rates.sample_bytes <= 1.0:  # a plain dataset: its storage's bandwidth is not known
        out["bandwidth"] = {"x": [], "base_bytes_per_s": None, "y": []}
        return out
    out["bandwidth"] = {
        "x": scales,  # times the storage bandwidth measured
        "base_bytes_per_s": b0,
        "y": [predict(rates, replace(base, bandwidth=b0 * s)).samples_per_s for s in scales],
    }
    return out


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
