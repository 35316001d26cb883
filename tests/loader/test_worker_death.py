"""A worker's death leaves no queue lock held: torch's shutdown (at the epoch's end, at exit)
must not hang (see unstall/loader/workers/worker_death.py)."""

from __future__ import annotations

import threading

import torch

from unstall.loader.workers.worker_death import release_queue_locks, release_stuck_locks


def _raise_in(self: object) -> None:
    """Fails in a frame whose ``self`` is ``self``, as torch's iterator methods do."""
    raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")


def test_an_abandoned_index_queue_lock_is_released_and_shutdown_completes():
    loader = torch.utils.data.DataLoader(list(range(16)), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    # What torch's SIGCHLD handler leaves when it raises inside Queue.put:
    it._index_queues[1]._notempty.acquire()
    try:
        _raise_in(it)
    except RuntimeError as exc:
        assert release_stuck_locks(exc) == 1
    assert release_queue_locks(it) == 0  # nothing held any more
    done = threading.Thread(target=it._shutdown_workers, daemon=True)
    done.start()
    done.join(timeout=30)
    assert not done.is_alive(), "torch's shutdown hung on a queue lock"
    assert all(not w.is_alive() for w in it._workers)


def test_locks_in_use_are_left_alone():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=1)
    it = iter(loader)
    assert [b.tolist() for b in it] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    try:
        _raise_in(it)
    except RuntimeError as exc:
        assert release_stuck_locks(exc) == 0
    try:
        _raise_in(object())  # no torch iterator in the traceback
    except RuntimeError as exc:
        assert release_stuck_locks(exc) == 0
