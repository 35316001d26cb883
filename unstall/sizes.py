"""Sizes written as text ("8GiB", "512 MB", "1.5g"): the one reader of them, for the cache's
capacities and the remote workers' bytes in flight alike."""

from __future__ import annotations

import re

#: Decimal (k, kB, MB, ...) and binary (KiB, MiB, ...) units, any case; no unit: bytes.
UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """The bytes ``text`` names (a number and an optional unit of `UNITS`), rounded down.

    Raises:
        ValueError: ``text`` is not a number with a known unit (the caller names its setting).
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise ValueError(f"cannot read {text!r} as a size (e.g. '512MiB', '8GB', '1.5g')")
    return int(float(match.group(1)) * UNITS[unit])
