"""A script run that does not end in time: stopped whole, and where each process was told.

Each Python process of an analyzed run (`arm`, called by the agent at start-up and again
in each forked child) dumps every thread's stack to ``OUT/stacks-<pid>.txt`` on
``SIGNAL``: faulthandler writes from the signal handler itself, so a process blocked in C
(a collective, a lock, a read) answers too. The launcher (`run_script`) starts the script
in a process group of its own; past its time it asks the group for stacks, stops it
(SIGINT, so Python unwinds and frees workers and shared memory; SIGKILL after
``GRACE_S``) and raises `RunTimedOut` naming where each process was. Without this, the
timeout killed the script's first process only and left its ranks and workers running.

A run past its time whose processes still use the CPU is slow, not stuck, and is given more
time (up to `EXTEND` times its time): two ranks of a framework and their workers on a busy
2-core machine can take longer than the time a test gives them while never hanging.
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO

#: The signal that asks a process for its stacks (Lightning's SLURM requeue takes SIGUSR1).
SIGNAL = signal.SIGUSR2
#: The signal that asks a process for its loaders' state (`unstall.launch.state`).
STATE = signal.SIGUSR1
#: Seconds between SIGINT and SIGKILL for a run that is past its time.
GRACE_S = 5.0
#: Frames of each thread shown in the error.
FRAMES = 6
#: A run past its time is looked at for this long at a time [s] ...
CHECK_S = 3.0
#: ... and given more time while its processes use at least this much CPU in it [s] ...
BUSY_S = 0.1
#: ... up to this many times its time in all.
EXTEND = 3.0
#: Lines of the script's output shown in the error.
TAIL = 12

_file: IO[str] | None = None
_TICK = os.sysconf("SC_CLK_TCK")


class RunTimedOut(TimeoutError):
    """A run of the script did not end within its time; the message says where it was."""


def arm(out: str) -> None:
    """Dump this process's stacks to ``out`` on ``SIGNAL``, unless the script uses it."""
    if not out or signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
        return
    if _register(out):
        os.register_at_fork(after_in_child=lambda: _register(out))


def _register(out: str) -> bool:
    global _file
    try:
        f = open(os.path.join(out, f"stacks-{os.getpid()}.txt"), "w")  # noqa: SIM115
    except OSError:
        return False
    if _file is not None:
        _file.close()  # a forked child's copy of its parent's file
    _file = f
    faulthandler.register(SIGNAL, file=f, all_threads=True)
    return True


def run_script(
    command: Sequence[str], env: dict[str, str], timeout: float, out: str, mode: str
) -> subprocess.CompletedProcess:
    """Run ``command`` in a process group of its own; the whole group is stopped if it
    outlives ``timeout`` seconds (`RunTimedOut`) or the caller is interrupted (Ctrl-C,
    SIGTERM, SIGHUP: the script's own handlers then run, `end_group`). SIGUSR1 to the
    analyzer prints what the run's loaders are doing."""
    with _run_signals(out):
        return _run(command, env, timeout, out, mode)


def _run(
    command: Sequence[str], env: dict[str, str], timeout: float, out: str, mode: str
) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        list(command),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        _running[:] = [proc]
        if _stopping:  # a SIGTERM came while the script was being started
            raise SystemExit(128 + _stopping[0])
        stdout = _communicate(proc, timeout)
    except subprocess.TimeoutExpired:
        _ask_for_stacks(out, proc.pid)
        time.sleep(1.0)  # faulthandler writes at once; a busy 2-core machine needs a moment
        where = stacks(out)
        ended = proc.poll()
        tail = end_group(proc).strip().splitlines()[-TAIL:]
        what = (
            f"ended (exit {ended}), but processes it started were still running after "
            f"{timeout:g} s and were stopped; "
            if ended is not None
            else f"did not end within {timeout:g} s and was stopped ({_why(proc, timeout)}); "
        )
        raise RunTimedOut(
            f"the {mode} run of {' '.join(command)} "
            + what
            + (f"where its processes were:\n{where}" if where else "no process told its stacks")
            + ("\nthe script's last output:\n  " + "\n  ".join(tail) if tail else "")
        ) from None
    except BaseException:
        end_group(proc)
        raise
    end_group(proc)  # what the script left running in its group (nothing, normally) goes too
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, None)


def _communicate(proc: subprocess.Popen, timeout: float) -> str:
    """``proc``'s output once it ends. Past ``timeout`` a run whose processes still use the
    CPU is slow, not stuck (two ranks and their workers on a busy 2-core machine): it is
    given `CHECK_S` more at a time, up to `EXTEND` times ``timeout`` in all; one that used
    less than `BUSY_S` of CPU in the last `CHECK_S` raises `subprocess.TimeoutExpired`."""
    start, wait, checking = time.monotonic(), timeout, False
    while True:
        before = group_cpu(proc.pid)
        try:
            return proc.communicate(timeout=wait)[0]
        except subprocess.TimeoutExpired:
            if checking:  # a check's window ended: did the run work in it?
                idle = _used(before, group_cpu(proc.pid)) < BUSY_S
                proc._unstall_idle = idle  # type: ignore[attr-defined]
                if idle or time.monotonic() - start >= EXTEND * timeout:
                    raise
            wait, checking = CHECK_S, True


def group_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds of each live process of process group ``pgid`` (from /proc)."""
    out: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the group used between two `group_cpu` samples."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


def _why(proc: subprocess.Popen, timeout: float) -> str:
    if getattr(proc, "_unstall_idle", True):
        return f"its processes used less than {BUSY_S:g} s of CPU in its last {CHECK_S:g} s: stuck"
    return f"still working after {EXTEND:g} x its time"


_running: list[subprocess.Popen] = []  # the run now going
_stopping: list[int] = []  # a SIGTERM or SIGHUP that came before it started


@contextlib.contextmanager
def _run_signals(out: str) -> Iterator[None]:
    """While a run goes: SIGTERM and SIGHUP end the analyzer as Ctrl-C does (the run's group
    is stopped, `end_group`), SIGUSR1 prints the run's loaders' state, and an ignored SIGINT
    (a background job's) is not passed on to the script, which `end_group` stops with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if not _running:  # the script is being started: `_run` ends it once it has started
            _stopping.append(signum)
            return
        raise SystemExit(128 + signum)

    def state(signum: int, frame: object) -> None:
        if _running:
            _ask_for_stacks(out, _running[0].pid, (STATE,))
            time.sleep(1.0)
            print(
                _states(out) or "unstall analyze: no process of the run answered", file=sys.stderr
            )

    wanted = {signal.SIGTERM: stop, signal.SIGHUP: stop, STATE: state}
    old = {
        s: signal.signal(s, h)
        for s, h in wanted.items()
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # the child must not inherit it
        old[signal.SIGINT] = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _running.clear()
        _stopping.clear()


def _states(out: str) -> str:
    """Every state file (`unstall.launch.state`) in ``out``."""
    parts = []
    for path in sorted(glob.glob(os.path.join(out, "state-*.txt"))):
        with open(path, errors="replace") as f:
            parts.append(f.read().strip())
    return "\n".join(parts)


def end_group(proc: subprocess.Popen) -> str:
    """Stop what is left of the script's process group: SIGINT (Python unwinds, frees its
    workers and shared memory), SIGKILL after ``GRACE_S``; the output not yet read."""
    if _alive(proc):
        _signal_group(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + GRACE_S
        while _alive(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(proc.pid, signal.SIGKILL)
    if proc.stdout is None or proc.stdout.closed:  # read to its end already
        proc.wait()
        return ""
    try:
        return proc.communicate(timeout=GRACE_S)[0] or ""
    except subprocess.TimeoutExpired:  # a process outside the group holds the output open
        proc.kill()
        proc.wait()
        return ""


def _alive(proc: subprocess.Popen) -> bool:
    """Whether a live process of the group is left (the first one reaped when it has ended;
    zombies that a container's init never reaps do not count)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc: the signal's answer stands
        return True
    return any(_live_in(pid, proc.pid) for pid in pids)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, process group)`` of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        return state, int(ppid), int(pgrp)
    except (OSError, IndexError, ValueError):
        return None


def _live_in(pid: int, pgid: int) -> bool:
    """Whether ``pid`` runs (not a zombie) in process group ``pgid``."""
    stat = _stat(pid)
    return stat is not None and stat[2] == pgid and stat[0] != "Z"


def _dumps(out: str) -> list[tuple[int, str]]:
    """``(pid, path)`` of each armed process's stack file in ``out``, by pid."""
    found = []
    for path in glob.glob(os.path.join(out, "stacks-*.txt")):
        found.append((int(os.path.basename(path)[len("stacks-") : -len(".txt")]), path))
    return sorted(found)


def _ask_for_stacks(out: str, pgid: int, signals: tuple[int, ...] = ()) -> None:
    """``SIGNAL`` (stacks) and `STATE` (the loaders' state, `unstall.launch.state`) to each
    process of the run that armed them (its file is in ``out``) and still catches them, and
    no other: the signals' default action would end a process that does not (a shell, a
    helper, a process whose framework reset its handlers at its end, as Lightning's does),
    and a pid of the run's that has ended may be another's by now."""
    for pid, _path in _dumps(out):
        if _live_in(pid, pgid):
            for sig in signals or (SIGNAL, STATE):
                if catches(pid, sig):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its ``SigCgt`` mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stacks(out: str) -> str:
    """Each process's threads from its dump in ``out``, innermost ``FRAMES`` frames each;
    threads wholly in the standard library (queue feeders, idle pools) are counted only."""
    parts = []
    for pid, path in _dumps(out):
        with open(path, errors="replace") as f:
            text = f.read().strip()
        if text:
            parts.append(f"  process {pid}{_whose(pid)}:\n" + _trim(text))
        state = os.path.join(out, f"state-{pid}.txt")
        if os.path.exists(state):  # what its loaders were doing (its watchdog's report)
            with open(state, errors="replace") as f:
                parts.append("\n".join("    " + line for line in f.read().strip().splitlines()))
    return "\n".join(parts)


def _whose(pid: int) -> str:
    """`` (child of P: command)`` from /proc while the process still runs."""
    stat = _stat(pid)
    if stat is None:
        return ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    cmd = cmd if len(cmd) <= 70 else cmd[:67] + "..."
    return f" (child of {stat[1]}: {cmd})"


def _trim(text: str) -> str:
    """faulthandler's dump, each thread cut to its innermost frames (listed first)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    threads: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):  # "Thread 0x... (most recent call first):"
            threads.append([line.replace(" (most recent call first)", "")])
        elif threads:
            threads[-1].append(line.strip())
    # longest first: a venv's site-packages before a prefix it lies under
    prefixes = sorted({f'File "{p}/' for p in sysconfig.get_paths().values()}, key=len)[::-1]
    shown, idle = [], []
    for head, *frames in threads:
        if frames and all(f'File "{stdlib}/' in f for f in frames):
            # where it is, in one line: a queue's feeder thread stuck writing shows here
            idle.append(" <- ".join(_where(f) for f in frames[:2]))
            continue
        shown += ["    " + head] + ["      " + _short(f, prefixes) for f in frames[:FRAMES]]
    if idle:
        shown.append(
            f"    ({len(idle)} thread(s) in the standard library alone: {'; '.join(idle)})"
        )
    return "\n".join(shown)


def _where(frame: str) -> str:
    """``queues.py:_feed:250`` from a faulthandler frame line."""
    try:
        path, rest = frame.split('File "', 1)[1].split('", line ', 1)
        line, _, func = rest.partition(" in ")
        return f"{os.path.basename(path)}:{func.strip()}:{line.strip()}"
    except (IndexError, ValueError):
        return frame.strip()


def _short(frame: str, prefixes: list[str]) -> str:
    """A frame's file relative to the install it is in (``torch/utils/data/...``)."""
    for p in prefixes:
        if frame.startswith(p):
            return 'File "' + frame[len(p) :]
    return frame
