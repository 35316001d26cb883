"""After a worker died: release the queue locks torch's SIGCHLD handler may have left held.

NOTE [ A killed worker and torch's index queues ]
torch learns that a worker died from a SIGCHLD handler that *raises* in the main
thread, wherever that thread is. When it lands inside ``multiprocessing.Queue.put``
(the main thread puts the next batch's indices into a worker's queue after every
batch, and ``prefetch_factor x num_workers`` of them when an epoch starts), after
the queue's ``_notempty`` lock was taken but before the ``with`` block that releases
it was entered, the lock stays held by no one. The next ``put`` on that queue, the
one torch's shutdown makes to stop the workers, then waits forever: the training
process hangs at the end of the epoch or at exit (seen here: a worker SIGKILLed at
its first batch hung its loader's process about once in 20 runs; pytorch/pytorch#26072,
"DataLoader workers fail to die", reports the same freeze in that shutdown ``put``).

`release_stuck_locks` finds torch's iterator in the failure's traceback and frees
any such lock. It is safe: the queue's feeder thread holds ``_notempty`` only for a
few instructions (its ``wait`` releases it), so a lock still held after a short
wait is one that nobody will release.
"""

from __future__ import annotations

import signal
import threading
import traceback
import weakref
from typing import Any

import torch.utils.data.dataloader as torch_dataloader

#: How long a lock may stay held before it counts as abandoned [seconds].
STUCK_AFTER_S = 0.05


def release_stuck_locks(exc: BaseException) -> int:
    """Free the abandoned queue locks of every torch iterator in ``exc``'s traceback.

    Returns:
        How many locks were released (0 in the usual case).
    """
    released, seen = 0, set()
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        it = frame.f_locals.get("self")
        if isinstance(it, torch_dataloader._BaseDataLoaderIter) and id(it) not in seen:
            seen.add(id(it))
            released += release_queue_locks(it)
    return released


def release_queue_locks(torch_iter: Any) -> int:
    """Free abandoned ``_notempty`` locks of ``torch_iter``'s index queues; how many."""
    released = 0
    for queue in getattr(torch_iter, "_index_queues", ()):
        cond = getattr(queue, "_notempty", None)
        if cond is None:
            continue
        if cond.acquire(timeout=STUCK_AFTER_S):
            cond.release()
            continue
        cond.release()  # held by no running code: an exception raised inside put() left it
        released += 1
    return released


_retire: weakref.WeakSet[Any] = weakref.WeakSet()  # slot hand-offs of running epochs


def retire_on_worker_death(handoff: Any) -> None:
    """Unlink ``handoff``'s slots the moment torch learns a worker died.

    torch's SIGCHLD handler raises wherever the main thread is: often outside the
    loader (in the training loop's own code), where no ``except`` of unstall's sees
    it. A wrapper around that handler retires the slot pools of every running
    epoch first (batches already received stay readable; later ones take torch's
    path), then lets torch's error go on.
    """
    _retire.add(handoff)
    if threading.current_thread() is not threading.main_thread():
        return
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_handler) or getattr(torch_handler, "_unstall_retires", False):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            torch_handler(signum, frame)
        except BaseException:
            for each in list(_retire):
                each.retire()
            raise

    handler._unstall_retires = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)
