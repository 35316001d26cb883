"""The best configuration this machine allows, by the model's predictions.

The recommendation searches workers and cache sizes within this node's cores and
free shared memory (the cache lives in ``/dev/shm``), keeps the cheapest
configuration within 3 % of the best prediction, and states it as
`unstall.DataLoader` arguments a config file carries to an unchanged script.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unstall.analysis.model.predict import Config, per_worker_rate, predict
from unstall.analysis.model.whatif import CACHE_STEPS, worker_steps
from unstall.analysis.rates.result import Rates


def max_cache_fraction(rates: Rates, num_samples: int, room_bytes: float | None) -> float:
    """The largest cache fraction ``room_bytes`` (the node's free shared memory and half its
    RAM, as measured) can hold."""
    dataset_bytes = rates.sample_bytes * num_samples
    if rates.sample_bytes <= 1.0:  # sizes unknown (a dataset listing no files): no cache binds
        return 0.0
    if room_bytes is None:
        return 0.0
    return max(0.0, min(1.0, room_bytes / dataset_bytes))


def recommend(
    rates: Rates,
    base: Config,
    num_samples: int,
    measured: float,
    *,
    cache_room_bytes: float | None,
    unknown: dict[str, str] | None = None,
    shared: bool = False,
) -> dict[str, Any]:
    """The cheapest configuration within 3 % of the best the model finds on this machine
    (``cache_room_bytes``: what a cache may take of it, as measured).

    Never one predicted slower than the job measured as it is; fewer workers only where
    the workers' own measured time per sample shows the fewer can keep the measured rate
    (``LOWER_MARGIN`` above it) and the machine is not ``shared`` with other busy jobs (the
    scheduler shares cores by runnable threads: fewer workers would get a smaller share, so
    there is no evidence either way); nothing that rests on a rate that was not measured.
    """
    unknown = unknown or {}
    top_cache = max_cache_fraction(rates, num_samples, cache_room_bytes)
    counts = worker_steps(rates.cores, base.workers)  # the pools this machine's cores allow
    current = predict(rates, base).samples_per_s
    floor = max(measured, current)
    options = [(current, base)]
    if "prep" not in unknown:
        caches = sorted({c for c in CACHE_STEPS if c <= top_cache} | {round(top_cache, 3)})
        if "fetch" in unknown and rates.sample_bytes > 1.0:
            caches = [base.cache]
        per_worker = per_worker_rate(rates, base)
        for w in counts:
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


def file_cache_advice(files: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """What the recommendation's cache is for a dataset that opens its files itself (issue
    40): its size in bytes of the files the dataset lists, or why no cache can apply to it.
    ``files``: the measured facts (`unstall.analysis.measure.script.files`); empty or
    ``applies`` None for unstall's own datasets (nothing to add)."""
    if files.get("applies") is False:
        return {"cache_not_applied": f"the node cache cannot apply: {files['why']}"}
    fraction = rec["kwargs"].get("cache")
    if not files.get("applies") or not fraction:
        return {}
    return {
        "cache_bytes": int(fraction * files["bytes"]),
        "cache_files": (
            f"the node cache holds {fraction:g} of the {files['files']} files "
            f"{files['where']} lists (whole files, read by the dataset's own open); "
            "unstall run --config FILE applies it, the script unedited"
        ),
    }


def _why_unchanged(unknown: dict[str, str]) -> str:
    if "prep" in unknown:
        return f"no loader setting is advised: {unknown['prep']}"
    return "no loader setting is predicted to beat the job as it is; see the remedies"
