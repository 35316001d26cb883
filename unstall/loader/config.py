"""Loader settings from a file: how a recommendation reaches an unchanged script.

``unstall run --config FILE`` sets ``$UNSTALL_CONFIG=FILE``; every unstall loader made
in that process tree then takes the file's ``kwargs`` over the script's own.
"""

from __future__ import annotations

import json
from typing import Any

#: Arguments a config file may set (plain values; ``cache`` is a capacity).
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
)


def load_overrides(path: str) -> dict[str, Any]:
    """The ``kwargs`` of the JSON file at ``path``, checked; ``cache`` becomes a `Cache`."""
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
        from unstall.cache import Cache

        out["cache"] = Cache(out["cache"])
    elif "cache" in out:
        out["cache"] = None
    return out


def settable() -> list[str]:
    """The keyword arguments a config file may set."""
    return list(_SETTABLE)
