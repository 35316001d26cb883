"""LRU over the same segment's paged layout, for comparison only: what the OS page cache does,
at our capacity (`unstall.cache.policy.Lru` chooses these functions).

Items are stored in fixed-size pages chained like a FAT (``next_page``), so an
evicted item's pages can hold any later item. Every get and put runs under the
segment lock and evicts the least recently used READY item (a scan of
``last_use``) until the new item fits: correct, simple, not fast. Under
per-epoch shuffling it hits far below C/N (DESIGN.md section 2), which is the
point of having it.
"""

from __future__ import annotations

import itertools

import numpy as np

from unstall.cache.shm.index import (
    EMPTY,
    H_CACHED_BYTES,
    H_CACHED_ITEMS,
    H_CLOCK,
    H_EVICTIONS,
    H_FREE_HEAD,
    H_FREE_PAGES,
    H_TOO_LARGE,
    READY,
    ShmCache,
)

_NEVER = np.iinfo(np.int64).max


def page_size_for(mean_item_bytes: float) -> int:
    """A power of two near 1/32 of the mean item (256 B .. 1 MiB): about 1.5 % lost to tails."""
    target = max(256.0, min(float(1 << 20), mean_item_bytes / 32))
    return 1 << int(np.floor(np.log2(target)))


def lru_get_many(
    cache: ShmCache, indices: list[int], versions: np.ndarray | None = None
) -> tuple[list[bytes | None], int]:
    """Bytes of each cached item of the expected version (None if absent or stale), and the
    number of stale ones; marks hits as most recently used."""
    out: list[bytes | None] = [None] * len(indices)
    hdr, page, base, mm = cache.hdr, cache.layout.page_size, cache.data_off, cache.mm
    stale = 0
    with cache.locked():
        for k, i in enumerate(indices):
            if cache.state[i] != READY:
                continue
            if versions is not None and int(cache.version[i]) != int(versions[k]):
                stale += 1
                continue
            hdr[H_CLOCK] += 1
            cache.last_use[i] = hdr[H_CLOCK]
            remaining, p, parts = int(cache.length[i]), int(cache.offset[i]), []
            while remaining > 0:
                take = min(page, remaining)
                parts.append(mm[base + p * page : base + p * page + take])
                remaining -= take
                p = int(cache.next_page[p])
            out[k] = parts[0] if len(parts) == 1 else b"".join(parts)
    return out, stale


def lru_put_many(
    cache: ShmCache,
    items: list[tuple[int, bytes]],
    versions: np.ndarray | None = None,
    since: int = 0,
) -> tuple[int, int]:
    """Store each item not cached (or cached under another version), evicting least recently
    used items. Returns (items, bytes)."""
    hdr, page, base, mm = cache.hdr, cache.layout.page_size, cache.data_off, cache.mm
    stored = size = 0
    with cache.locked():
        for k, (i, raw) in enumerate(items):
            need = max(1, -(-len(raw) // page))
            want = int(versions[k]) if versions is not None else 0
            if cache.state[i] != EMPTY:
                if versions is None or int(cache.version[i]) == want:
                    continue
                if int(cache.stored_by[i]) > since:
                    continue  # stored for a newer listing than ours (see ShmCache.claim)
                _free_item(cache, int(i))  # stale: its pages go back to the free list
            if need > cache.layout.n_pages:
                hdr[H_TOO_LARGE] += 1
                continue
            while int(hdr[H_FREE_PAGES]) < need:
                _evict_one(cache)
            pages = _take_pages(cache, need)
            for n, p in enumerate(pages):
                chunk = raw[n * page : (n + 1) * page]
                mm[base + p * page : base + p * page + len(chunk)] = chunk
            cache.offset[i], cache.length[i], cache.version[i] = pages[0], len(raw), want
            cache.stored_by[i] = since
            hdr[H_CLOCK] += 1
            cache.last_use[i] = hdr[H_CLOCK]
            cache.state[i] = READY
            hdr[H_CACHED_ITEMS] += 1
            hdr[H_CACHED_BYTES] += len(raw)
            stored, size = stored + 1, size + len(raw)
    return stored, size


def lru_check(cache: ShmCache) -> None:
    """Assert every page is either free or in exactly one cached item's chain."""
    page, owner = cache.layout.page_size, np.full(cache.layout.n_pages, -1, dtype=np.int64)
    with cache.locked():
        for i in np.flatnonzero(cache.state == READY).tolist():
            p, count = int(cache.offset[i]), max(1, -(-int(cache.length[i]) // page))
            for _ in range(count):
                if owner[p] != -1:
                    raise AssertionError(f"page {p} belongs to items {owner[p]} and {i}")
                owner[p], p = i, int(cache.next_page[p])
            if p != -1:
                raise AssertionError(f"item {i}'s page chain is longer than its length")
        free, p = 0, int(cache.hdr[H_FREE_HEAD])
        while p != -1:
            if owner[p] != -1:
                raise AssertionError(f"free page {p} is also held by item {owner[p]}")
            owner[p], p, free = -2, int(cache.next_page[p]), free + 1
        if free != int(cache.hdr[H_FREE_PAGES]) or (owner == -1).any():
            raise AssertionError(
                f"{free} pages on the free list, header says {int(cache.hdr[H_FREE_PAGES])}; "
                f"{int((owner == -1).sum())} pages lost"
            )


def _evict_one(cache: ShmCache) -> None:
    """Free the pages of the least recently used item (lock held)."""
    ages = np.where(cache.state == READY, cache.last_use, _NEVER)
    victim = int(ages.argmin())
    if ages[victim] == _NEVER:
        raise RuntimeError("LRU cache has no item to evict but too few free pages (corrupt?)")
    _free_item(cache, victim)
    cache.hdr[H_EVICTIONS] += 1


def _free_item(cache: ShmCache, i: int) -> None:
    """Put item ``i``'s pages back on the free list and mark it EMPTY (lock held)."""
    p, remaining = int(cache.offset[i]), int(cache.length[i])
    hdr, page = cache.hdr, cache.layout.page_size
    count = max(1, -(-remaining // page))
    for _ in range(count):
        nxt = int(cache.next_page[p])
        cache.next_page[p] = hdr[H_FREE_HEAD]
        hdr[H_FREE_HEAD] = p
        p = nxt
    hdr[H_FREE_PAGES] += count
    cache.state[i] = EMPTY
    hdr[H_CACHED_ITEMS] -= 1
    hdr[H_CACHED_BYTES] -= remaining


def _take_pages(cache: ShmCache, need: int) -> list[int]:
    """Pop ``need`` pages off the free list and chain them (lock held)."""
    hdr, pages = cache.hdr, []
    for _ in range(need):
        p = int(hdr[H_FREE_HEAD])
        hdr[H_FREE_HEAD] = cache.next_page[p]
        pages.append(p)
    for a, b in itertools.pairwise(pages):
        cache.next_page[a] = b
    cache.next_page[pages[-1]] = -1
    hdr[H_FREE_PAGES] -= need
    return pages
