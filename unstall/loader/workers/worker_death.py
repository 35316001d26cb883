"""Workers' lives: started, stopped when their owner goes, and after one died, the queue
locks torch's SIGCHLD handler may have left held released (the note below).

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

import os
import signal
import threading
import traceback
import weakref
from typing import Any

import torch

from unstall.loader.workers import torch_iter, watchdog
from unstall.loader.workers.torch_shutdown import shutdown

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
        if torch_iter.is_torch_iter(it) and id(it) not in seen:
            seen.add(id(it))
            released += release_queue_locks(it)
    return released


def release_queue_locks(raw: Any) -> int:
    """Free abandoned ``_notempty`` locks of torch iterator ``raw``'s index queues; how many."""
    released = 0
    for cond in torch_iter.index_queue_locks(raw):
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


def start_workers(inner: Any, loaded: dict[str, Any] | None = None) -> Any:
    """``iter(inner)`` (torch's loader: starts its workers); a worker that dies while it
    starts leaves no queue lock held.

    ``loaded``: a resumed torch-order epoch, whose workers' base seed its first run drew
    already: a private generator, seeded from the saved one, gives it instead.
    """
    own = inner.generator
    if loaded is not None:
        inner.generator = torch.Generator()
        inner.generator.manual_seed(int(loaded.get("base_seed") or 0) % 2**63)
    try:
        return watchdog.started(inner)  # the tasks it sends are recorded for the watchdog
    except BaseException as exc:
        release_stuck_locks(exc)
        raise
    finally:
        inner.generator = own


def owning_workers(epoch_iter: Any, raw: Any, loader: Any) -> Any:
    """``epoch_iter``, whose workers (torch iterator ``raw``'s) stop when it goes, or,
    persistent ones, when ``loader`` goes (`stop_workers_when_gone`)); their waits are
    watched (`unstall.loader.workers.watchdog`)."""
    if torch_iter.workers(raw):
        watchdog.watch(raw, loader)
        persistent = torch_iter.persistent(raw)
        stop_workers_when_gone(loader if persistent else epoch_iter, raw)
    return epoch_iter


def stop_workers_when_gone(owner: Any, raw: Any) -> None:
    """Shut torch iterator ``raw``'s workers down as soon as ``owner`` is freed, collector or not.

    A torch iterator freed by the garbage collector (it sat in a reference cycle, e.g.
    through a kept exception's traceback) stops its workers only after the collector
    stopped its queues' feeder threads: the "exit" messages never leave, and each
    worker waits out torch's 5 s timeout (10 s for 2 workers, in whichever thread the
    collector ran). This finalizer holds the iterator, so it is never in the collected
    set: when ``owner`` goes, its shutdown runs with working queues. Only in the process
    that started the workers (a forked child's copy must not stop its parent's).
    """
    if getattr(raw, "_unstall_stopper", None) is not None:
        return  # persistent workers: one finalizer for the iterator's whole life
    stopper = weakref.finalize(owner, _shutdown, os.getpid(), raw)
    stopper.atexit = False  # at exit torch's own handlers stop the workers
    raw._unstall_stopper = stopper


def _shutdown(pid: int, raw: Any) -> None:
    if os.getpid() == pid:
        raw._unstall_stopper = None  # no cycle: the iterator goes by refcount now
        shutdown(raw)


def stop_workers(raw: Any) -> None:
    """Shut torch iterator ``raw``'s workers down now (a pool change), its finalizer detached.

    torch forgets their pids first: their exits raise nothing in the loop.
    """
    stopper = getattr(raw, "_unstall_stopper", None)
    if stopper is not None:
        stopper.detach()
        raw._unstall_stopper = None
    shutdown(raw)
