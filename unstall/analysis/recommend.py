"""What-if tables and curves from the model, and the best configuration this machine allows.

The recommendation searches workers and cache sizes within this node's cores and
free shared memory (the cache lives in ``/dev/shm``), keeps the cheapest
configuration within 3 % of the best prediction, and states it as
`unstall.DataLoader` arguments a config file carries to an unchanged script.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from unstall.analysis.model import Config, Rates, fetch_seconds_per_batch, predict

CACHE_STEPS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Shared memory left free when sizing a recommended cache [Unit: byte].
SHM_MARGIN = 256 << 20


def worker_steps(cores: float, current: int) -> list[int]:
    top = max(int(cores) * 2, current, 1)
    steps = sorted({1, 2, 4, 8, 16, 32, 64, current, int(cores), top})
    return [w for w in steps if 1 <= w <= top]


def max_cache_fraction(rates: Rates, num_samples: int) -> float:
    """The largest cache fraction this node's free shared memory (and half its RAM) can hold."""
    dataset_bytes = rates.sample_bytes * num_samples
    if rates.sample_bytes <= 1.0:  # plain dataset: sizes unknown, unstall's cache cannot bind
        return 0.0
    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize - SHM_MARGIN
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // 2
    except (OSError, ValueError):
        return 0.0
    return max(0.0, min(1.0, min(free, ram) / dataset_bytes))


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
    from unstall.analysis.probe import UNLIMITED

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


def recommend(
    rates: Rates,
    base: Config,
    num_samples: int,
    measured: float,
    *,
    unknown: dict[str, str] | None = None,
    shared: bool = False,
) -> dict[str, Any]:
    """The cheapest configuration within 3 % of the best the model finds on this machine.

    Never one predicted slower than the job measured as it is; fewer workers only where
    the workers' own measured time per sample shows the fewer can keep the measured rate
    (``LOWER_MARGIN`` above it) and the machine is not ``shared`` with other busy jobs (the
    scheduler shares cores by runnable threads: fewer workers would get a smaller share, so
    there is no evidence either way); nothing that rests on a rate that was not measured.
    """
    unknown = unknown or {}
    top_cache = max_cache_fraction(rates, num_samples)
    current = predict(rates, base).samples_per_s
    floor = max(measured, current)
    options = [(current, base)]
    if "prep" not in unknown:
        caches = sorted({c for c in CACHE_STEPS if c <= top_cache} | {round(top_cache, 3)})
        if "fetch" in unknown and rates.sample_bytes > 1.0:
            caches = [base.cache]
        per_worker = per_worker_rate(rates, base)
        for w in worker_steps(rates.cores, base.workers):
            if w < base.workers and (shared or w * per_worker < LOWER_MARGIN * measured):
                continue  # no measured evidence that fewer workers keep the rate
            for c in caches:
                config = replace(base, workers=w, cache=c)
                p = predict(rates, config).samples_per_s
                if config != base and p >= floor:
                    options.append((p, config))
    # a costlier configuration must be predicted faster; a cheaper one at least as fast
    cost = lambda c: c.workers + 4 * c.cache  # noqa: E731
    options = [(p, c) for p, c in options if c == base or cost(c) < cost(base) or p >= GAIN * floor]
    best = max(p for p, _ in options)
    cheap = [(cost(c), -p, c) for p, c in options if p >= 0.97 * best]
    _, neg, config = min(cheap, key=lambda t: (t[0], t[1]))
    changed = config != base
    predicted = -neg if changed else max(current, measured)
    kwargs: dict[str, Any] = {"num_workers": config.workers}
    if config.cache > 0:
        kwargs["cache"] = config.cache
    return {
        "kwargs": kwargs,
        "config": config.label(),
        "changed": changed,
        "predicted_samples_per_s": round(predicted, 1),
        "measured_samples_per_s": round(measured, 1),
        # model over model: the measured rate carries the machine's noise of the moment
        "predicted_speedup": round(predicted / current, 3) if current > 0 else None,
        "predicted_current_samples_per_s": round(current, 1),
        "bound": predict(rates, config).bound,
        "limits": {"cores": rates.cores, "max_cache_fraction": round(top_cache, 3)},
        **({"why_unchanged": _why_unchanged(unknown)} if not changed else {}),
    }


#: A configuration must be predicted this much faster than the job as it is to be advised.
GAIN = 1.03
#: Fewer workers only if they can, by their measured time per sample, do this much more.
LOWER_MARGIN = 1.1


def per_worker_rate(rates: Rates, base: Config) -> float:
    """Samples/s one worker delivers by its measured time per sample (CPU + I/O), alone."""
    per_sample = rates.prep_cpu_s + fetch_seconds_per_batch(rates, base, 0.0) / max(
        1, base.batch_size
    )
    return 1.0 / per_sample if per_sample > 0 else 0.0


def _why_unchanged(unknown: dict[str, str]) -> str:
    if "prep" in unknown:
        return f"no loader setting is advised: {unknown['prep']}"
    return "no loader setting is predicted to beat the job as it is; see the remedies"
