"""The config file's loader settings (``unstall run --config FILE``, ``$UNSTALL_CONFIG``,
`unstall analyze`'s ``recommendation.json``): its ``kwargs``, checked.

Without torch: ``unstall run --config`` checks the file before the program starts, and
the launcher must not pay torch's import for that (2.4 s of start-up measured here).
`unstall.loader.settings` takes these kwargs over the script's own.
"""

from __future__ import annotations

import json
from typing import Any

from unstall import machine
from unstall.loader.cache_binding import cache_of

#: Arguments a config file may set (plain values; ``cache`` is a capacity, or an object
#: such as ``{"size": "8GiB", "hold": "samples"}``: `unstall.loader.cache_binding`).
_SETTABLE = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "zero_copy",
    "prep",
    "device",
    "seed",
    "cache",
    "coordinate",
    "remote",
)


def config_overrides() -> dict[str, Any]:
    """Keyword arguments from ``$UNSTALL_CONFIG`` (a JSON file with a ``kwargs`` object)."""
    path = machine.config_path()
    return load_overrides(path) if path else {}


def load_overrides(path: str) -> dict[str, Any]:
    """The ``kwargs`` of the JSON file at ``path``, checked; ``cache`` becomes a `Cache`
    (`unstall.loader.cache_binding.cache_of`), 0 none."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"UNSTALL_CONFIG={path!r} cannot be read as JSON: {exc}") from exc
    kwargs = doc.get("kwargs", doc) if isinstance(doc, dict) else None
    if not isinstance(kwargs, dict):
        raise ValueError(f"UNSTALL_CONFIG={path!r} must hold a JSON object of DataLoader kwargs")
    unknown = sorted(set(kwargs) - set(_SETTABLE))
    if unknown:
        raise ValueError(
            f"UNSTALL_CONFIG={path!r} sets {unknown}, which a config cannot set; "
            f"use some of {list(_SETTABLE)}"
        )
    out = dict(kwargs)
    if out.get("num_workers") == 0:
        out.setdefault("prefetch_factor", None)
        out.setdefault("persistent_workers", False)
    if out.get("cache") not in (None, 0, "0"):
        out["cache"] = cache_of(out["cache"])
    elif "cache" in out:
        out["cache"] = None
    return out


def settable() -> list[str]:
    """The keyword arguments a config file may set."""
    return list(_SETTABLE)
