"""Test processes forked from one that imported torch and unstall once (a fork server).

A member of a sweep or a second job on the node, started as ``python -m ...`` or
``python -c ...``, spends 2-3 s of CPU importing torch before its first line: on the suite's
two cores, three such members in a test are seconds of wall time that the test does not
measure. Forked from a fork server (`multiprocessing`'s, with the modules preloaded), each is
still its own process with its own environment, working directory, pid, output and exit
status (a negative signal number when killed), started in a fraction of a second.

Use `server` (a context manager: the fork server goes at its end, so no process of it outlives
the module that started it) and `Forked` as a `subprocess.Popen` with files for its output.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

#: Imported once by the fork server (a module that fails to import is skipped there and
#: imported by each process instead).
PRELOAD = ("torch", "unstall.loader.dataloader", "unstall.cache")


@contextlib.contextmanager
def server(preload: tuple[str, ...] = PRELOAD) -> Iterator[Any]:
    """The fork-server context, with ``preload`` imported there; stopped at the end."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    try:
        yield ctx
    finally:
        server = forkserver._forkserver
        if server._forkserver_pid is not None:  # started: nothing of it is needed any more
            os.kill(server._forkserver_pid, signal.SIGKILL)  # (its exit would unload torch)
        server._stop()  # reaps it (Python's own tests stop it so)


def _main(
    argv: list[str], env: dict[str, str], cwd: str, out: str, err: str, session: bool
) -> None:
    """Run ``python *argv`` in this (forked) process: ``-m MODULE``, ``-c CODE`` or a script's
    path; in a session (and process group) of its own with ``session``, as
    ``Popen(start_new_session=True)`` would."""
    if session:
        os.setsid()
    # as in a fresh interpreter: the platform's default start method (the fork server's own
    # child would otherwise start its processes with the fork server too)
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    flag, what, *rest = argv
    try:
        if flag == "-m":
            sys.argv = [what, *rest]
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        elif flag == "-c":
            sys.argv = ["-c", *rest]
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
        elif not flag.startswith("-"):
            sys.argv = [flag, what, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(flag))
            runpy.run_path(flag, run_name="__main__")
        else:
            raise ValueError(f"forked: {flag!r} is neither -m, -c nor a script")
    finally:
        atexit._run_exitfuncs()  # what an interpreter runs at exit
        sys.stdout.flush()
        sys.stderr.flush()


class Forked:
    """``python *argv`` forked from the fork server ``ctx``, as `subprocess.Popen` would run it
    (``args`` is that command line); stdout and stderr go to ``output``.out / .err, read back
    as text with ``text``; ``session``: its own session and process group."""

    def __init__(
        self,
        ctx: Any,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        output: Path,
        session: bool = False,
        text: bool = False,
    ) -> None:
        self.args = [sys.executable, *argv]
        self.text = text
        self.out, self.err = output.with_suffix(".out"), output.with_suffix(".err")
        args = (list(argv), dict(env), str(cwd), str(self.out), str(self.err), session)
        self.process = ctx.Process(target=_main, args=args)
        self.process.start()
        self.pid = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Wait for the end; ``(stdout, stderr)`` (str with ``text``, else bytes)."""
        self.wait(timeout)
        out, err = self.output()
        return (out.decode(), err.decode()) if self.text else (out, err)

    def output(self) -> tuple[bytes, bytes]:
        """What it wrote so far: ``(stdout, stderr)``."""
        read = lambda p: p.read_bytes() if p.exists() else b""  # noqa: E731
        return read(self.out), read(self.err)

    def first_line(self, timeout: float) -> str:
        """Its first line of output (waiting up to ``timeout`` s), "" if it ended first."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.output()[0].decode()
            if "\n" in text:
                return text.split("\n", 1)[0] + "\n"
            if self.poll() is not None or time.monotonic() > deadline:
                return ""
            time.sleep(0.02)

    def kill(self) -> None:
        self.process.kill()


def run(
    ctx: Any, argv: list[str], *, env: dict[str, str], output: Path, timeout: float
) -> subprocess.CompletedProcess:
    """``python *argv`` forked from ``ctx`` to its end, as ``subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)`` gives it (killed past ``timeout``)."""
    proc = Forked(ctx, argv, env=env, cwd=Path.cwd(), output=output, text=True)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode or 0, out, err)
