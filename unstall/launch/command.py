"""The environment that puts a command under unstall, and starting it.

`unstall run` replaces itself with the command (``exec``, as ``ddtrace-run`` and
``opentelemetry-instrument`` do): signals, the terminal, the exit status and the
traceback are the program's own, with nothing in between to forward them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: The folder whose ``sitecustomize.py`` starts unstall in every Python process.
SITE_DIR = Path(__file__).resolve().parent / "site"


def run_env(
    *,
    json_path: str | None = None,
    config_path: str | None = None,
    root_pid: int | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (default: this process's environment) set up for a run under unstall.

    Args:
        json_path: where the run's first process writes every loader's figures.
        config_path: a JSON file of loader settings every loader takes (``--config``).
        root_pid: the process that prints the summary (default: this one, which then
            becomes the command by ``exec``).
    """
    env = dict(os.environ if base is None else base)
    paths = [str(SITE_DIR), *filter(None, env.get("PYTHONPATH", "").split(":"))]
    package_root = SITE_DIR.parent.parent.parent
    if package_root.name not in ("site-packages", "dist-packages"):  # a source checkout
        paths.insert(1, str(package_root))  # so `import unstall` works from any directory
    env["PYTHONPATH"] = ":".join(dict.fromkeys(paths))
    # named, not made: the first process that writes a report makes it (so a command
    # with no Python in it leaves nothing behind)
    token = secrets.token_hex(4)
    env["UNSTALL_RUN_DIR"] = os.path.join(
        tempfile.gettempdir(), f"unstall-run-{os.getpid()}-{token}"
    )
    env["UNSTALL_RUN_ROOT"] = str(os.getpid() if root_pid is None else root_pid)
    if json_path:
        env["UNSTALL_RUN_JSON"] = str(Path(json_path).resolve())
    if config_path:
        from unstall.loader.config_file import load_overrides

        load_overrides(config_path)  # a bad file fails here, before the program starts
        env["UNSTALL_CONFIG"] = str(Path(config_path).resolve())
    return env


def exec_command(command: Sequence[str], env: dict[str, str]) -> int:
    """Become ``command`` (found on PATH) when it is a Python program: it then reports and
    prints the summary itself. Any other command (a shell script that starts Python, ``env``)
    runs as a child instead, and this process prints the summary once it exits (so a run
    leaves nothing behind either way); returns its exit status. Raises FileNotFoundError
    naming the command if it is absent."""
    program = shutil.which(command[0], path=env.get("PATH")) or command[0]
    if not os.path.exists(program):
        raise FileNotFoundError(f"unstall run: command not found: {command[0]!r}")
    if is_python(program):
        os.execve(program, list(command), env)
    return _run_child(program, command, {**env, "UNSTALL_RUN_ROOT": str(os.getpid())})


def is_python(program: str) -> bool:
    """Whether ``program`` is a Python interpreter or a script run by one (torchrun too)."""
    names = {os.path.basename(program), os.path.basename(os.path.realpath(program))}
    if any(n.startswith(("python", "pypy")) for n in names):
        return True
    try:
        with open(program, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _run_child(program: str, command: Sequence[str], env: dict[str, str]) -> int:
    """Run ``command`` as a child; forward SIGTERM, SIGHUP and SIGINT to it, then print the
    summary and exit as it did.

    The handlers are in place before the child starts: a signal that comes while it is being
    started is delivered to it once it runs, never lost (nor does it end this process and
    leave the child running). SIGINT is not forwarded when it came from the terminal: a
    terminal's Ctrl-C reaches every process of its foreground group, the child included.
    """
    import signal
    import subprocess

    from unstall.launch import report

    pending: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and _terminal_sent_it():
            return
        if child:
            child[0].send_signal(signum)
        else:
            pending.append(signum)

    # an ignored signal stays ignored, here and in the child (which inherits it)
    forwarded = [s for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if _handled(s)]
    old = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        child.append(subprocess.Popen([program, *command[1:]], env=env))
        for signum in pending:
            child[0].send_signal(signum)
        code = child[0].wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    os.environ.update({k: env[k] for k in ("UNSTALL_RUN_DIR", "UNSTALL_RUN_ROOT")})
    if "UNSTALL_RUN_JSON" in env:
        os.environ["UNSTALL_RUN_JSON"] = env["UNSTALL_RUN_JSON"]
    report.print_summary()
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _terminal_sent_it() -> bool:
    """Whether this process is in its terminal's foreground group (a SIGINT then came from
    the terminal's Ctrl-C, which reached the child as well)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no terminal: the SIGINT was sent to this process alone
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _handled(signum: int) -> bool:
    import signal

    return signal.getsignal(signum) is not signal.SIG_IGN
