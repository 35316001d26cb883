"""Cache policies as objects, one class each, chosen once per segment by name (`policy_named`).

``noevict`` (the default) fills once and never evicts: under per-epoch shuffling it
hits C/N, the most any cache of C items can (DESIGN.md section 2). ``lru`` evicts the
least recently used item, for comparison only (`unstall.cache.lru`): what the OS page
cache does, at the same capacity. A policy decides the segment's layout (packed or
paged), how its items are read and stored, how much of it is used, and how it is
checked; nothing else in the package asks which policy it has.
"""

from __future__ import annotations

import numpy as np

from unstall.cache.lru import lru_check, lru_get_many, lru_put_many, page_size_for
from unstall.cache.shm.index import ShmCache


class Policy:
    """What a policy decides; one subclass per policy, one instance each (`POLICIES`)."""

    name = ""
    #: Readers take no lock (the peer server serves such hits on its event loop).
    lock_free = False
    #: A disk tier can sit under it (items go to RAM or disk, never both).
    stacks = False

    def page_size(self, mean_item_bytes: float) -> int:
        """The data area's page size for items of this mean size (0: not paged)."""
        raise NotImplementedError

    def fit(self, room: int, page_size: int) -> int:
        """The capacity that fits in ``room`` bytes of data area."""
        raise NotImplementedError

    def get_many(
        self, cache: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        """Bytes of each cached item of the expected version (None otherwise), and the stale."""
        raise NotImplementedError

    def put_many(
        self,
        cache: ShmCache,
        items: list[tuple[int, bytes]],
        versions: np.ndarray | None,
        since: int,
    ) -> tuple[int, int]:
        """Store what is not cached (or stale); returns (items, bytes)."""
        raise NotImplementedError

    def check(self, cache: ShmCache) -> None:
        """Assert the segment's index is consistent (tests)."""
        raise NotImplementedError


class NoEvict(Policy):
    """Fill until full, then keep: items packed back to back, read without a lock."""

    name = "noevict"
    lock_free = True
    stacks = True

    def page_size(self, mean_item_bytes: float) -> int:
        return 0

    def fit(self, room: int, page_size: int) -> int:
        return room

    def get_many(
        self, cache: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        return cache.lookup(indices, versions)

    def put_many(
        self,
        cache: ShmCache,
        items: list[tuple[int, bytes]],
        versions: np.ndarray | None,
        since: int,
    ) -> tuple[int, int]:
        return cache.put_many(items, versions, since)  # see `ShmCache.claim`

    def check(self, cache: ShmCache) -> None:
        cache.check()


class Lru(Policy):
    """Least recently used, for comparison only: paged, every get and put under the lock."""

    name = "lru"

    def page_size(self, mean_item_bytes: float) -> int:
        return page_size_for(mean_item_bytes)

    def fit(self, room: int, page_size: int) -> int:
        return room // page_size * page_size

    def get_many(
        self, cache: ShmCache, indices: list[int], versions: np.ndarray | None
    ) -> tuple[list[bytes | None], int]:
        return lru_get_many(cache, indices, versions)

    def put_many(
        self,
        cache: ShmCache,
        items: list[tuple[int, bytes]],
        versions: np.ndarray | None,
        since: int,
    ) -> tuple[int, int]:
        return lru_put_many(cache, items, versions, since)

    def check(self, cache: ShmCache) -> None:
        lru_check(cache)


#: Every policy by name.
POLICIES: dict[str, Policy] = {p.name: p for p in (NoEvict(), Lru())}


def policy_named(name: str) -> Policy:
    """The policy called ``name``.

    Raises:
        ValueError: naming the policy and the known ones.
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"policy={name!r} is unknown; use one of {sorted(POLICIES)}") from None
