"""SIGUSR1: each process of an ``unstall run`` (or ``unstall analyze``) says what its loaders
are doing, as the loader's watchdog would (`unstall.loader.watchdog.describe_all`): for each
running epoch, the batch the loop waits for, the tasks outstanding and on which worker,
each worker's pid, state and CPU time, the slots and the autotuner's last change.

It goes to the process's stderr, headed by its pid and rank; under ``unstall analyze`` to
``$UNSTALL_ANALYZE_OUT/state-<pid>.txt`` instead, which the analyzer prints (on its own
SIGUSR1, and in the error of a run past its time). A script that handles SIGUSR1 itself
(Lightning's SLURM requeue) keeps its handler: the state is then not printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any

#: The signal that asks a process for its loaders' state.
SIGNAL = signal.SIGUSR1
#: The file each process writes its state to under ``unstall analyze`` (``{pid}``).
FILE = "state-{pid}.txt"


def install() -> None:
    """Answer `SIGNAL` in this process, unless the script has a handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
        return
    signal.signal(SIGNAL, _answer)


def _answer(signum: int, frame: Any) -> None:
    with contextlib.suppress(Exception):  # a report must never break the script
        from unstall import machine

        text = report()
        out = machine.analyze_env().out
        if not (out and os.path.isdir(out)):
            print(text, file=sys.stderr, flush=True)
            return
        path = os.path.join(out, FILE.format(pid=os.getpid()))  # the analyzer shows it
        with open(path + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(path + ".tmp", path)


def report() -> str:
    """This process's loaders' state, headed by its pid and rank."""
    from unstall import machine
    from unstall.loader.watchdog import describe_all

    return f"unstall: state of pid {os.getpid()} (rank {machine.rank()}):\n{describe_all()}"
