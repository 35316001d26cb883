"""The loader's watchdog: a wait for a batch that no worker is making progress on ends in an
error naming the stuck part, never in a training job that hangs with nothing in its logs.

torch's iterator waits for its next batch in ``_try_get_data`` (a queue read with a 5 s
timeout, in a loop that ends only when a batch arrives or a worker has died). `watch`
wraps that method of one torch iterator: each read is cut to `POLL_S`, and between reads
the watchdog looks at the workers. Progress is a batch arriving from any worker (in order
or not) or a worker's CPU time growing by `CPU_STEP_S`; a wait longer than the bound with
neither raises `LoaderStuckError`, whose message says what each part was doing: the batches
outstanding and the worker each was sent to (with its dataset indices), each worker's pid,
state (a worker stopped by SIGSTOP shows ``stopped``) and CPU time, the zero-copy hand-off's
slots and the autotuner's last change. Before it raises, the workers are killed and torch's
iterator shut down (the epoch iterator then unlinks its slots, as after a worker's death),
so nothing is left behind.

A worker stuck at start (issue 46: one forked while another thread of the parent held a
lock, e.g. a gloo or queue feeder thread, never runs) is not waited out: once the batch the
loop waits for is a worker's that is alive, used almost no CPU and made no batch some seconds
after it started, its pool is stopped and the epoch goes on at the same batch on a new pool
(`unstall.loader.workers.stuck_start`), at most a few times an epoch; then the bound stands.

The bound: ``DataLoader(watchdog_s=...)``, else ``$UNSTALL_WATCHDOG_S``, else `DEFAULT_S`;
0 turns the watchdog off. Once batches have come, it is at least `SCALE` times the slowest
batch's fetch + prepare time, so a job whose batches are slow by nature is never stopped.

`describe_all` gives the same state for every watched iterator of the process: what
``unstall run`` and ``unstall analyze`` print on SIGUSR1 and when a run is past its time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import weakref
from typing import Any

from unstall import machine
from unstall.errors import UnstallError
from unstall.loader.workers import stuck_start, torch_iter
from unstall.loader.workers.torch_shutdown import shutdown

#: The bound when none is set [s]: a few minutes.
DEFAULT_S = 300.0
#: The environment variable that sets the bound for every loader without ``watchdog_s``.
ENV = machine.WATCHDOG_ENV
#: Once batch times are known, the bound is at least this many times the slowest one.
SCALE = 10
#: Longest single queue read while waiting [s]: how often the workers are looked at.
POLL_S = 0.5
#: A worker whose CPU time grew by this much since the wait began is making progress [s].
CPU_STEP_S = 0.02
#: Dataset indices shown per batch in the report.
SHOWN = 8

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible I/O",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "exited (zombie)",
    "X": "dead",
}


class LoaderStuckError(UnstallError, RuntimeError):
    """The loop waited for a batch past the watchdog's bound while no worker made progress.

    The message says what each part was doing; ``state`` holds the same as a dict.
    """

    def __init__(self, message: str, state: dict[str, Any]):
        super().__init__(message)
        self.state = state


def bound_s(loader: Any) -> float:
    """The loader's bound in seconds (0: off): ``watchdog_s``, else `ENV`, else `DEFAULT_S`."""
    value = getattr(loader, "__dict__", {}).get("watchdog_s")
    if value is None:
        value = machine.watchdog_text() or DEFAULT_S
    try:
        bound = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"watchdog_s={value!r} must be a number of seconds (0: off)") from None
    if bound < 0:
        raise ValueError(f"watchdog_s={value!r} must be >= 0 (0: off)")
    return bound


#: Every watched torch iterator of this process still alive (for `describe_all`).
_live: weakref.WeakSet[Any] = weakref.WeakSet()


def started(inner: Any) -> Any:
    """``iter(inner)`` (torch's loader), each batch task's indices recorded from the first:
    torch sends ``prefetch_factor x num_workers`` tasks while its iterator is being made."""
    if inner.num_workers == 0 or torch_iter.running_iterator(inner) is not None:
        return iter(inner)  # no workers, or persistent ones (their iterator is recording)
    return torch_iter.iter_prepared(inner, _record)


def _record(it: Any) -> None:
    """Record the indices of each task ``it`` (a torch iterator) sends from now on."""
    it._unstall_watch = w = _Watch(it)
    torch_iter.wrap_next_index(it, w.next_index)


def watch(raw: Any, loader: Any) -> None:
    """Watch ``raw``'s waits for batches (a torch iterator with workers; idempotent),
    under ``loader``'s bound (`bound_s`)."""
    if not torch_iter.workers(raw):
        return
    if vars(raw).get("_unstall_watch") is None:  # made by torch alone: tasks sent from now on
        _record(raw)
    w = vars(raw)["_unstall_watch"]
    if w.loader() is not None:
        return
    w.loader = weakref.ref(loader) if loader is not None else w.loader
    w.bound = bound_s(loader)
    _live.add(raw)
    if w.bound > 0:
        torch_iter.wrap_try_get_data(raw, w.try_get_data)


def _waited(loader: Any, cpu_s: float) -> None:
    """Book ``cpu_s`` of the loop's thread spent on a read that found no batch and the look
    at the workers after it: a cost of the wait's length, not of the batch (the loader's
    `CpuMeter.receive_s` leaves it out)."""
    meter = getattr(loader, "main_cpu", None)
    if meter is not None:
        meter.waited(cpu_s)


class _Watch:
    """One torch iterator's watch (see the module's docstring). Holds it and the loader weakly:
    the iterator must still be freed by reference count (`worker_death.stop_workers_when_gone`)."""

    def __init__(self, raw: Any):
        self._iter = weakref.ref(raw)
        self.pid = os.getpid()  # a forked worker's copy is not its to describe
        self.loader: Any = lambda: None
        self.bound = 0.0
        self.sent: dict[int, Any] = {}  # torch task number -> its batch (dataset indices)
        self.slowest = 0.0  # the slowest batch's fetch + prepare seconds seen
        self.received = 0
        self._since = time.monotonic()  # the last progress (or the start of this wait)
        self._waiting = False  # in a wait that has seen no batch yet
        self._cpu: dict[int, float] = {}  # worker pid -> CPU seconds at the last progress
        self.made: set[int] = set()  # workers (ids) a batch came from

    # torch's methods, wrapped -------------------------------------------------
    def next_index(self) -> Any:
        it = self._iter()
        index = torch_iter.next_index_of(it)
        self.sent[torch_iter.tasks_sent(it)] = index  # type: ignore[index]
        return index

    def try_get_data(self, timeout: float = torch_iter.STATUS_CHECK_S) -> Any:
        it = self._iter()
        if not self._waiting:  # a new wait: the loop was away (training) until now
            self._waiting = True
            self._progress(it)
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            c0 = time.thread_time()
            ok, data = torch_iter.try_get_data_of(it, min(POLL_S, left))
            if ok:
                self._arrived(it, data)
                return ok, data
            self.check(it)
            _waited(self.loader(), time.thread_time() - c0)
            if time.monotonic() >= deadline:
                return ok, data

    # --------------------------------------------------------------------------
    def _arrived(self, it: Any, data: Any) -> None:
        self._waiting = False
        self.received += 1
        if isinstance(data, tuple) and len(data) == 2:
            info = torch_iter.task_info(it).get(data[0])
            if info:
                self.made.add(info[0])
            self.sent.pop(data[0], None)
            timing = data[1][1] if isinstance(data[1], tuple) and len(data[1]) == 2 else None
            spent = getattr(timing, "fetch_s", None)
            if spent is not None:
                self.slowest = max(self.slowest, spent + getattr(timing, "prep_s", 0.0))

    def _progress(self, it: Any) -> None:
        """Progress now: the wait's clock and each worker's CPU time start from here."""
        self._since = time.monotonic()
        workers = torch_iter.workers(it)
        self._cpu = {w.pid: cpu for w in workers if (cpu := _proc(w.pid)[1]) is not None}

    def limit(self) -> float:
        return max(self.bound, SCALE * self.slowest)

    def check(self, it: Any) -> None:
        """Raise `LoaderStuckError` (workers stopped first) past the bound with no progress."""
        stuck_start.check(self.loader(), it, self.made, _proc, _stop_workers)  # may restart
        now = time.monotonic()
        for w in torch_iter.workers(it):
            cpu = _proc(w.pid)[1]
            if cpu is not None and cpu - self._cpu.setdefault(w.pid, cpu) >= CPU_STEP_S:
                self._progress(it)
                return
        waited = now - self._since
        if waited <= self.limit():
            return
        state = self.state(it, waited)
        message = render(state)
        _stop_workers(it)
        # persistent workers: the next iter() starts a new pool
        torch_iter.forget_iterator(getattr(self.loader(), "_inner", None), it)
        raise LoaderStuckError(message, state)

    def state(self, it: Any, waited: float | None = None) -> dict[str, Any]:
        """What each part of this iterator is doing, as a dict (`render` writes it out)."""
        info = torch_iter.task_info(it)
        outstanding = sorted(i for i, v in info.items() if len(v) == 1)
        workers = []
        for wid, w in enumerate(torch_iter.workers(it)):
            letter, cpu = _proc(w.pid)
            mine = [i for i in outstanding if info[i][0] == wid]
            workers.append(
                {
                    "worker": wid,
                    "pid": w.pid,
                    "state": _STATES.get(letter or "", letter or "gone"),
                    "cpu_s": None if cpu is None else round(cpu, 2),
                    "active": torch_iter.worker_active(it, wid),
                    "current_task": mine[0] if mine else None,
                    "queued": len(mine[1:]),
                }
            )
        loader = self.loader()
        handoff = getattr(loader, "_handoff", None)
        tuner = getattr(loader, "_autotune", None)
        return {
            "pid": os.getpid(),
            "rank": getattr(loader, "rank", 0),
            "loader": type(loader).__name__,
            "dataset": type(getattr(loader, "dataset", None)).__name__,
            "waited_s": None if waited is None else round(waited, 1),
            "bound_s": round(self.limit(), 1),
            "waiting_for": torch_iter.waiting_for(it),
            "sent": torch_iter.tasks_sent(it),
            "received": self.received,
            "outstanding": [
                {"task": i, "worker": info[i][0], "indices": _indices(self.sent.get(i))}
                for i in outstanding
            ],
            "workers": workers,
            "handoff": handoff.stats() if handoff is not None else None,
            "autotune": (tuner.history[-1] if tuner.history else "no change yet")
            if tuner is not None
            else None,
        }


def _indices(task: Any) -> list[int] | None:
    """A task's dataset indices: a batch list, or ``(indices, slot)`` with zero-copy slots."""
    if isinstance(task, tuple) and task:
        task = task[0]
    if isinstance(task, list):
        return [int(i) if isinstance(i, int) else i for i in task]
    return None


def _proc(pid: int | None, *, with_age: bool = False) -> Any:
    """``(state letter, CPU seconds)`` of process ``pid`` from /proc, ``(None, None)`` if gone;
    ``with_age``: its seconds since it started too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out = fields[0], (int(fields[11]) + int(fields[12])) / _TICK
        if with_age:
            with open("/proc/uptime") as f:
                out += (float(f.read().split()[0]) - int(fields[19]) / _TICK,)
        return out
    except (OSError, IndexError, ValueError):
        return (None, None, None) if with_age else (None, None)


def _stop_workers(it: Any) -> None:
    """Kill ``it``'s workers (a stopped or stuck one answers nothing else) and shut torch's
    iterator down; torch forgets their pids first, so their deaths raise nothing."""
    torch_iter.forget_worker_pids(it)
    for w in torch_iter.workers(it):
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(w.pid, signal.SIGKILL)
    for w in torch_iter.workers(it):
        w.join(timeout=5)
    with contextlib.suppress(Exception):  # the error to raise is the watchdog's
        shutdown(it)


def render(state: dict[str, Any]) -> str:
    """``state`` (`_Watch.state`) as the lines of the error and of the SIGUSR1 report."""
    who = f"rank {state['rank']}, pid {state['pid']}"
    head = f"unstall: {state['loader']} of {state['dataset']} ({who})"
    if state["waited_s"] is not None:
        head += (
            f": waited {state['waited_s']:g} s for batch task {state['waiting_for']} while no "
            f"worker made progress (watchdog bound {state['bound_s']:g} s: "
            f"DataLoader(watchdog_s=...) or ${ENV}; 0 turns it off)"
        )
    else:
        head += f": waiting for batch task {state['waiting_for']}"
    lines = [head, f"  tasks sent {state['sent']}, batches received {state['received']}"]
    if state["outstanding"]:
        lines.append("  outstanding batch tasks:")
        for t in state["outstanding"]:
            lines.append(
                f"    task {t['task']}: worker {t['worker']}, "
                f"dataset indices {_short(t['indices'])}"
            )
    else:
        lines.append("  outstanding batch tasks: none (no worker was given the batch waited for)")
    for w in state["workers"]:
        task = "idle" if w["current_task"] is None else f"on task {w['current_task']}"
        lines.append(
            f"  worker {w['worker']}: pid {w['pid']}, {w['state']}, cpu {w['cpu_s']} s, {task}"
            + (f", {w['queued']} more queued" if w["queued"] else "")
            + ("" if w["active"] else " (retired)")
        )
    if state["handoff"] is not None:
        lines.append(f"  zero-copy hand-off: {state['handoff']}")
    if state["autotune"] is not None:
        lines.append(f"  autotune, last change: {state['autotune']}")
    return "\n".join(lines)


def _short(indices: list[int] | None) -> str:
    if indices is None:
        return "(not recorded)"
    if len(indices) <= SHOWN:
        return str(indices)
    return f"[{', '.join(map(str, indices[:SHOWN]))}, ...] ({len(indices)})"


def describe_all() -> str:
    """Every live watched iterator's state in this process (``unstall run``'s SIGUSR1)."""
    parts = []
    for it in list(_live):
        w = vars(it).get("_unstall_watch")
        if w is None or w.pid != os.getpid() or torch_iter.is_shut_down(it):
            continue
        with contextlib.suppress(Exception):  # a report must never raise
            parts.append(render(w.state(it)))
    return "\n".join(parts) if parts else f"unstall: pid {os.getpid()}: no loader is running"
