"""The segment layout (header, process slots, per-item index, data area), its one lookup, and
no-eviction put (claim, copy, publish).

One file, mapped by every process that uses it::

    header   64 int64 words: magic, version, items, capacity, policy, bump pointer,
             items/bytes cached, LRU clock and free list, ...
    slots    SLOTS x 9 int64: pid, owner pid, group, hits, misses, inserted, bytes, stamp,
             stale
    index    offset int64[N], length int64[N], version int64[N], stored_by int64[N],
             state uint8[N], (LRU) last_use int64[N]
    pages    (LRU) next_page int32[P]
    data     capacity bytes

An item is published in three steps: under the lock, claim it (`ShmCache.claim`:
state EMPTY -> CLAIMED, bump the allocator, record offset and length); without the
lock, copy its bytes into the data area; under the lock again, set state READY
(`ShmCache.publish`; the disk tier's index uses the same two). Readers of the
no-eviction cache take no lock: they load ``state`` first and use offset, length
and data only if it reads READY. That is safe where stores become visible in
program order and loads are not reordered with older loads (x86-64 TSO); the
writer side orders itself on any CPU because the publish runs inside ``flock``
(a system call). Readers on weakly ordered CPUs (ARM) would need an acquire
barrier after the state load, which Python cannot express: we assume x86-64.
A second filler of the same item sees CLAIMED or READY and does not store it.

Every item carries the *version* of its source it was stored for (an int64 the
dataset derives from size + mtime + inode, or size + ETag; see
`unstall.stores.listing`). A reader passes the versions it expects: an item READY
under another version is *stale*, a miss (counted), never served. A filler with a
newer listing replaces it (``stored_by``: when the storing job bound the cache; an
older job leaves a newer job's item alone and reads storage): under the lock the item
goes READY -> CLAIMED with a fresh offset (the old bytes stay where they were, unused:
the bump pointer only grows), then READY with the new version. A lock-free reader therefore checks
state and version again after copying the bytes, and drops what changed meanwhile.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from unstall.cache.shm import segment

MAGIC = 0x554E5354414C4C31  # "UNSTALL1"
VERSION = 2
#: Policy names and the codes the header stores (`unstall.cache.policy` holds their behaviour).
POLICIES = {"noevict": 0, "lru": 1}
_POLICY_NAMES = {code: name for name, code in POLICIES.items()}
SLOTS = 128
EMPTY, CLAIMED, READY = 0, 1, 2

# header words
(H_MAGIC, H_VERSION, H_ITEMS, H_CAPACITY, H_POLICY, H_BUMP) = range(6)
(H_CACHED_ITEMS, H_CACHED_BYTES, H_CLOCK, H_FREE_HEAD, H_PAGE, H_PAGES) = range(6, 12)
(H_EVICTIONS, H_CREATED, H_DATASET_BYTES, H_FREE_PAGES, H_FP0, H_FP1) = range(12, 18)
(H_TOO_LARGE, H_RECLAIMS) = range(18, 20)
# 20..23: the disk tier's own words (`unstall.cache.disk_tier`)
#: Unix time until which a segment with no user is kept (0: in use, or its users died).
H_KEEP_UNTIL = 24
#: Bytes of replaced (stale) items: allocated, no longer reachable.
H_STALE_BYTES = 25
#: When the last user left [Unit: nanosecond since the epoch].
H_LEFT_AT = 26
HEADER_WORDS = 64
# slot words
S_PID, S_OWNER, S_GROUP, S_HITS, S_MISSES, S_INSERTED, S_BYTES, S_STAMP = range(8)
S_STALE = 8
SLOT_WORDS = 9


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Sizes that fix where everything lies in a segment; computed once, stored in the header.

    ``page_size`` > 0 makes the data area paged (an evicting policy's: items in chained
    pages, a ``last_use`` word per item); 0 (no eviction) packs items back to back.
    """

    n_items: int
    capacity: int
    policy: str = "noevict"
    page_size: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is unknown; use one of {sorted(POLICIES)}")

    @property
    def n_pages(self) -> int:
        return self.capacity // self.page_size if self.page_size else 0

    @property
    def data_bytes(self) -> int:
        return self.n_pages * self.page_size if self.page_size else self.capacity

    def offsets(self) -> dict[str, int]:
        """Byte offset of each part, and ``"end"``: the file size."""
        n, out = self.n_items, {}
        pos = HEADER_WORDS * 8
        for part, size in (
            ("slots", SLOTS * SLOT_WORDS * 8),
            ("offset", 8 * n),
            ("length", 8 * n),
            ("version", 8 * n),
            ("stored_by", 8 * n),
            ("state", n),
            ("last_use", 8 * n if self.page_size else 0),
            ("next_page", 4 * self.n_pages),
            ("data", self.data_bytes),
        ):
            out[part] = pos
            pos = _align(pos + size, 4096 if part == "next_page" else 64)
        out["end"] = max(pos, 4096)
        return out

    @property
    def file_size(self) -> int:
        return self.offsets()["end"]

    def overhead(self) -> int:
        """Bytes of the file that are not data."""
        return self.file_size - self.data_bytes


def fingerprint_words(fingerprint: str) -> tuple[int, int]:
    """Two int64 words identifying the dataset (from its hex fingerprint, else a hash of it)."""
    try:
        raw = bytes.fromhex(fingerprint)[:16]
    except ValueError:
        raw = b""
    if len(raw) < 16:
        raw = hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()
    a, b = np.frombuffer(raw, dtype=np.int64)
    return int(a), int(b)


class ShmCache:
    """One process's mapping of a segment: numpy views on the header, slots, index and data."""

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path
        #: Orders this process's threads (``flock`` only excludes other processes).
        self.thread_lock = threading.Lock()
        size = os.fstat(fd).st_size
        if size < 4096:
            raise ValueError(f"{path!r} is not an unstall cache segment ({size} bytes)")
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.hdr = np.ndarray((HEADER_WORDS,), np.int64, self.mm, 0)
        if int(self.hdr[H_MAGIC]) == 0:  # fresh file: the creator sets the header next
            return
        if not self.valid():
            self.close_map()
            raise ValueError(f"{path!r} is not an unstall cache segment of version {VERSION}")
        self._map_views()

    def _map_views(self) -> None:
        self.layout = Layout(
            n_items=int(self.hdr[H_ITEMS]),
            capacity=int(self.hdr[H_CAPACITY]),
            policy=_POLICY_NAMES.get(int(self.hdr[H_POLICY]), "noevict"),
            page_size=int(self.hdr[H_PAGE]),
        )
        off, n, mm = self.layout.offsets(), self.layout.n_items, self.mm
        if off["end"] > len(mm):
            self.close_map()
            raise ValueError(f"{self.path!r} is shorter than its header says: not a segment")
        self.slots = np.ndarray((SLOTS, SLOT_WORDS), np.int64, mm, off["slots"])
        self.offset = np.ndarray((n,), np.int64, mm, off["offset"])
        self.length = np.ndarray((n,), np.int64, mm, off["length"])
        self.version = np.ndarray((n,), np.int64, mm, off["version"])
        self.stored_by = np.ndarray((n,), np.int64, mm, off["stored_by"])
        self.state = np.ndarray((n,), np.uint8, mm, off["state"])
        paged = self.layout.page_size > 0
        self.last_use = np.ndarray((n if paged else 0,), np.int64, mm, off["last_use"])
        self.next_page = np.ndarray((self.layout.n_pages,), np.int32, mm, off["next_page"])
        self.data_off = off["data"]
        self.capacity = self.layout.capacity

    def init_header(self, layout: Layout, fingerprint: str, dataset_bytes: int) -> None:
        """Write a fresh segment's header (the creator only, before it is published)."""
        hdr = self.hdr
        hdr[H_VERSION], hdr[H_ITEMS], hdr[H_CAPACITY] = VERSION, layout.n_items, layout.capacity
        hdr[H_POLICY], hdr[H_PAGE] = POLICIES[layout.policy], layout.page_size
        hdr[H_PAGES], hdr[H_FREE_PAGES] = layout.n_pages, layout.n_pages
        hdr[H_CREATED], hdr[H_DATASET_BYTES] = int(time.time()), dataset_bytes
        hdr[H_FP0], hdr[H_FP1] = fingerprint_words(fingerprint)
        hdr[H_MAGIC] = MAGIC
        self._map_views()
        if layout.page_size:  # paged: every page on the free list
            self.next_page[:] = np.arange(1, layout.n_pages + 1, dtype=np.int32)
            if layout.n_pages:
                self.next_page[-1] = -1
            hdr[H_FREE_HEAD] = 0 if layout.n_pages else -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the segment lock against other processes and other threads of this one."""
        with self.thread_lock, segment.locked(self.fd):
            yield

    def valid(self) -> bool:
        return int(self.hdr[H_MAGIC]) == MAGIC and int(self.hdr[H_VERSION]) == VERSION

    def matches(self, layout: Layout, fingerprint: str) -> bool:
        """Same dataset and items; capacity may differ (the existing segment's wins)."""
        return (
            self.valid()
            and self.layout.n_items == layout.n_items
            and self.layout.policy == layout.policy
            and (int(self.hdr[H_FP0]), int(self.hdr[H_FP1])) == fingerprint_words(fingerprint)
        )

    def close_map(self) -> None:
        """Unmap without closing the descriptor (the caller owns it on a failed open)."""
        self.__dict__.pop("hdr", None)
        self.mm.close()

    def close(self) -> None:
        views = ("hdr", "slots", "offset", "length", "version", "stored_by", "state", "last_use")
        for view in (*views, "next_page"):
            self.__dict__.pop(view, None)
        with contextlib.suppress(BufferError):  # a view is still held: unmapped at exit
            self.mm.close()
        os.close(self.fd)

    # The lookup (both tiers) and no-eviction put ---------------------------------------
    def lookup(
        self,
        indices: list[int],
        versions: np.ndarray | None = None,
        read: Callable[[np.ndarray, np.ndarray], list[bytes | None]] | None = None,
    ) -> tuple[list[bytes | None], int]:
        """Bytes of each READY item (of the ``versions`` expected, if given), None for the rest,
        and how many items were READY under another version (stale).

        The one lookup of the RAM and disk tiers: ``read(offsets, lengths)`` gives the
        bytes of the READY items (None where it cannot: a miss); by default `read_data`,
        this mapping's own data area; the disk tier reads its data file. No lock (see
        the module notes): state and version are read before the bytes and again after,
        so an item replaced meanwhile is a miss, never torn bytes.
        """
        idx = np.asarray(indices, dtype=np.intp)  # one conversion for every gather below
        ready = self.state[idx] == READY
        stale = 0
        if versions is not None:
            fresh = self.version[idx] == versions
            stale = int((ready & ~fresh).sum())
            ready &= fresh
        out: list[bytes | None] = [None] * len(indices)
        hit = np.flatnonzero(ready)
        if not len(hit):
            return out, stale
        which = idx[hit]
        # offsets and lengths loaded after the states (see notes)
        raws = (read or self.read_data)(self.offset[which], self.length[which])
        if len(raws) == len(indices):  # all hits: the reads are the answer, in order
            out = raws
        else:
            for k, raw in zip(hit.tolist(), raws, strict=True):
                out[k] = raw
        still = self.state[which] == READY
        if versions is not None:
            still &= self.version[which] == versions[hit]
        if not still.all():  # replaced while we copied: a miss
            for k in hit[~still].tolist():
                out[k] = None
        return out, stale

    def read_data(self, offsets: np.ndarray, lengths: np.ndarray) -> list[bytes | None]:
        """The bytes at ``offsets`` of this mapping's data area (the RAM tier's reads)."""
        starts = offsets + self.data_off
        mm = self.mm
        ends = (starts + lengths).tolist()
        return [mm[a:b] for a, b in zip(starts.tolist(), ends, strict=True)]

    def put_many(
        self, items: list[tuple[int, bytes]], versions: np.ndarray | None = None, since: int = 0
    ) -> tuple[int, int]:
        """Store items not yet cached (or cached under another version by a job bound no later
        than ``since``, see `claim`) while space lasts; never evicts. Returns (items, bytes)."""
        claims = self.claim(items, self.capacity, versions, since)
        if not claims:
            return 0, 0
        base = self.data_off
        for _i, start, raw in claims:
            self.mm[base + start : base + start + len(raw)] = raw
        with self.locked():
            return self.publish(claims)

    # The claim and publish steps (module notes), shared with the disk tier's index ---
    def claim(
        self,
        items: list[tuple[int, bytes]],
        capacity: int,
        versions: np.ndarray | None = None,
        since: int = 0,
    ) -> list[tuple[int, int, bytes]]:
        """Step 1, under the lock: room below ``capacity`` for each item that fits and is
        EMPTY, or READY under a version other than its entry in ``versions`` (stale: replaced)
        stored by a job bound no later than this one (``since``, ns): a job whose listing is
        older than the item's does not replace it, so two jobs never take turns.

        Returns ``(index, offset, raw)`` per claim; none once full (the bump pointer only
        grows, and nothing is evicted).
        """
        hdr = self.hdr
        room = capacity - int(hdr[H_BUMP])
        fits = [k for k, (_i, raw) in enumerate(items) if len(raw) <= room]
        if not fits:  # full: no lock needed
            return []
        claims = []
        with self.locked():
            for k in fits:
                i, raw = items[k]
                want = int(versions[k]) if versions is not None else 0
                bump, state = int(hdr[H_BUMP]), int(self.state[i])
                if state == CLAIMED or bump + len(raw) > capacity:
                    continue  # another filler has it, or full for this item
                if state == READY:
                    if versions is None or int(self.version[i]) == want:
                        continue  # cached already
                    if int(self.stored_by[i]) > since:
                        continue  # stored for a newer listing than ours
                    old = int(self.length[i])  # stale: its bytes become unreachable
                    hdr[H_CACHED_ITEMS] -= 1
                    hdr[H_CACHED_BYTES] -= old
                    hdr[H_STALE_BYTES] += old
                self.state[i] = CLAIMED  # first, so a lock-free reader's re-check sees it
                self.offset[i], self.length[i], self.version[i] = bump, len(raw), want
                self.stored_by[i] = since
                hdr[H_BUMP] = bump + len(raw)
                claims.append((i, bump, raw))
        return claims

    def publish(
        self, claims: list[tuple[int, int, bytes]], written: set[int] | None = None
    ) -> tuple[int, int]:
        """Step 3, the caller holding `locked`: each claim still ours goes READY, or back to
        EMPTY if its bytes were not ``written`` (None: all were). Returns (items, bytes)."""
        published = size = 0
        for i, start, raw in claims:
            # still our claim? (not if a reclaim reset it after our owner died)
            if self.state[i] != CLAIMED or int(self.offset[i]) != start:
                continue
            if written is None or i in written:
                self.state[i] = READY
                published, size = published + 1, size + len(raw)
            else:
                self.state[i] = EMPTY  # never stored: fetched from storage again
        self.hdr[H_CACHED_ITEMS] += published
        self.hdr[H_CACHED_BYTES] += size
        return published, size

    def check(self) -> None:
        """Assert the index is consistent (tests call this): items inside the data, no overlap.

        Raises:
            AssertionError: naming the first inconsistency found.
        """
        if self.layout.page_size:
            raise AssertionError(f"{self.path} is a paged (LRU) segment: use lru.lru_check")
        ready = np.flatnonzero(self.state == READY)
        held = np.flatnonzero(self.state != EMPTY)
        starts, ends = self.offset[held], self.offset[held] + self.length[held]
        order = np.argsort(starts, kind="stable")
        bump = int(self.hdr[H_BUMP])
        if len(held) and (starts.min() < 0 or ends.max() > bump or bump > self.capacity):
            raise AssertionError(f"item outside the data area [0, {bump}) of {self.path}")
        if len(held) > 1 and (starts[order][1:] < ends[order][:-1]).any():
            raise AssertionError(f"two items overlap in {self.path}")
        cached = int(self.length[ready].sum())
        if (len(ready), cached) != (int(self.hdr[H_CACHED_ITEMS]), int(self.hdr[H_CACHED_BYTES])):
            raise AssertionError(
                f"header says {int(self.hdr[H_CACHED_ITEMS])} items / "
                f"{int(self.hdr[H_CACHED_BYTES])} bytes, index has {len(ready)} / {cached}"
            )

    def used_bytes(self) -> int:
        """Bytes of the data area taken: the bump pointer, or the pages not free."""
        if self.layout.page_size:
            return (int(self.hdr[H_PAGES]) - int(self.hdr[H_FREE_PAGES])) * self.layout.page_size
        return int(self.hdr[H_BUMP])
