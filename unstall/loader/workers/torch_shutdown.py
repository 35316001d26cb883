"""torch's loader iterator shut down whole: its workers stopped, its queues' threads ended and
no shared-memory name of a killed worker left behind.

The one place unstall stops torch's iterator (the owner's finalizer and a pool change,
`unstall.loader.workers.worker_death`; the watchdog's stop, `unstall.loader.workers.watchdog`).
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Any

import torch.multiprocessing

from unstall import machine
from unstall.loader.workers import torch_iter

#: How long a shutdown waits for each index queue's feeder thread to end [seconds].
FEEDER_EXIT_S = 2.0


def shutdown(it: Any) -> None:
    """torch's ``_shutdown_workers``; then the feeder threads of its index queues ended, and
    the ``torch_PID_*`` names of workers that were killed removed.

    torch closes those queues without joining their threads (``cancel_join_thread``):
    each ends a moment later, on its own, so a loader just shut down still had a
    ``QueueFeederThread`` running (seen once in a test that counts threads after
    shutdown). Joining them, bounded (a feeder blocked on a full pipe whose reader died
    never ends), makes the shutdown whole when it returns.
    """
    torch_iter.shutdown_workers(it)
    for feeder in torch_iter.index_queue_feeders(it):
        feeder.join(timeout=FEEDER_EXIT_S)
    if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        for worker in torch_iter.workers(it):
            if worker.exitcode:  # killed (or failed): it may have died holding a name
                _unlink_torch_names(worker.pid)


def _unlink_torch_names(pid: int) -> None:
    """Remove the ``torch_PID_*`` names process ``pid`` (ended) left in the OS's shared memory.

    torch's ``file_descriptor`` strategy shares a tensor by creating ``/dev/shm/torch_PID_*``
    and unlinking it at once, passing the descriptor on: a worker killed between the two
    leaves the name for good (seen once in CI's layout: a 0-byte ``torch_16693_..._1``, its
    process gone). No one opens such a name later, so removing it loses nothing.
    """
    for path in glob.glob(os.path.join(machine.DEFAULT_SHM_DIR, f"torch_{pid}_*")):
        with contextlib.suppress(OSError):
            os.unlink(path)
