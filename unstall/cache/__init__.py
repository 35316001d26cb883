"""A node-wide cache of raw sample bytes: shared memory (RAM tier) over local disk (disk tier).

Use it as ``unstall.DataLoader(ds, cache=unstall.Cache("8GiB"))``; see `unstall.cache.cache`.
The layout, from the user down:

- `cache`: `Cache` (options, ``bind``); `tiers`: the loader's default (a disk tier for
  remote data); `inventory`: `list_caches` / `clear_caches` (``unstall cache list|clear``);
- `tiered`: the one fetch layer, composing the tiers; `opening`: opening them;
- `files`: the same tiers for datasets that open their files themselves (whole files by path);
- `tier`: the tier interface and what both tiers share; `ram_tier`, `disk_tier`
  (`disk_files`: its files, root and budget); `policy` (`lru`): eviction policies;
- `shm`: shared-memory files and their lifecycle; `capacity`, `items`: sizes, versions.
"""

from unstall.cache.cache import Cache
from unstall.cache.capacity import parse_capacity
from unstall.cache.disk_tier import DiskFullWarning
from unstall.cache.inventory import clear_caches, list_caches
from unstall.cache.opening import MIN_CAPACITY, SHM_MARGIN, SharedMemoryWarning

__all__ = [
    "MIN_CAPACITY",
    "SHM_MARGIN",
    "Cache",
    "DiskFullWarning",
    "SharedMemoryWarning",
    "clear_caches",
    "list_caches",
    "parse_capacity",
]
