"""Counters of one loader's peer traffic, summed over its worker processes (a small shm file).

The file also holds the loader's epoch generation (bumped by the main process at
each epoch's start): a peer that failed is skipped until it changes, so a node
that comes back rejoins at an epoch boundary, in persistent workers too.
"""

from __future__ import annotations

from unstall.cache.shm.words import SharedWords

NAMES = ("peer_hits", "peer_bytes", "peer_errors", "storage_reads", "storage_bytes")
_GENERATION = len(NAMES)


class SharedCounters:
    """int64 counters and the epoch generation, shared by a loader's processes; picklable."""

    def __init__(self) -> None:
        self.words = SharedWords("peers", len(NAMES) + 1)

    def add(self, **counts: int) -> None:
        with self.words.locked() as words:
            for name, value in counts.items():
                words[NAMES.index(name)] += value

    def read(self) -> dict[str, int]:
        try:
            words = self.words.view()
        except FileNotFoundError:  # closed: nothing left to report
            return dict.fromkeys(NAMES, 0)
        return {name: int(words[k]) for k, name in enumerate(NAMES)}

    def generation(self) -> int:
        """How many epochs the loader has begun."""
        try:
            return int(self.words.view()[_GENERATION])
        except FileNotFoundError:
            return -1

    def next_generation(self) -> None:
        with self.words.locked() as words:
            words[_GENERATION] += 1

    def close(self) -> None:
        self.words.close()
