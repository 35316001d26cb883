"""Shared-memory files and who uses them: the one place their lifecycle lives.

- `segment`: segment files (names, creation with reserved space, ``flock``, liveness of pids);
- `index`: a segment's layout (header, process slots, per-item index, data area), its
  one lookup and its no-eviction put (the disk tier's index file uses the same layout);
- `lifecycle`: open-or-create, process slots, reclaiming a dead job's segment, release
  and the one `lifecycle.remove` of a segment;
- `keep`: segments kept after their last user, released by time and by memory;
- `reaper`: the detached process that removes a kept segment when its time is up;
- `words`: a few shared words for a loader's processes (counters, clocks).
"""

from unstall.cache.shm.index import Layout, ShmCache
from unstall.cache.shm.lifecycle import SegmentBusyError
from unstall.cache.shm.words import SharedWords

__all__ = ["Layout", "SegmentBusyError", "SharedWords", "ShmCache"]
