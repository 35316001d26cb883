"""A thread's time spent runnable but waiting for a core, from ``/proc/thread-self/schedstat``.

The analyzer splits a worker's wall time per batch into CPU (prepare), waiting for a
core (oversubscription: more busy threads than cores) and the rest (waiting on I/O).
Read only while ``$UNSTALL_TIMELINE`` is set (by `unstall analyze`): two small reads per batch.
"""

from __future__ import annotations

import os

from unstall import machine

_PATH = "/proc/thread-self/schedstat"
_ON = machine.timeline() and os.path.exists(_PATH)


def runq_s() -> float:
    """Seconds this thread has waited on a run queue so far (-1.0 when not measured)."""
    if not _ON:
        return -1.0
    try:
        with open(_PATH, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return -1.0


def enable() -> None:
    """Measure from now on, in this process and the workers it starts (the analyzer's runs)."""
    global _ON
    _ON = os.path.exists(_PATH)
