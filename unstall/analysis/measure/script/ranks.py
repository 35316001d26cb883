"""How the ranks of one analyzed run agree on where to stop (or switch to the next mode).

Under DDP the first rank whose window is complete names the batch at which every rank stops
(a file in the run's output folder, created once), so no rank is left waiting in a collective.
"""

from __future__ import annotations

import json
import os
import time


def claim_stop(path: str, index: int, at: int) -> tuple[int, int]:
    """Name the batch at which every rank stops, unless a rank named one first."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return read_stop(path) or (index, at)
    with os.fdopen(fd, "w") as f:
        json.dump({"loader": index, "at": at}, f)
    return index, at


def read_stop(path: str) -> tuple[int, int] | None:
    for _ in range(50):  # written right after it is created: a moment at most
        try:
            with open(path) as f:
                doc = json.load(f)
            return int(doc["loader"]), int(doc["at"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.01)
    return None
