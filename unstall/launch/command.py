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
        from unstall.loader.config import load_overrides

        load_overrides(config_path)  # a bad file fails here, before the program starts
        env["UNSTALL_CONFIG"] = str(Path(config_path).resolve())
    return env


def exec_command(command: Sequence[str], env: dict[str, str]) -> None:
    """Become ``command`` (found on PATH); raises FileNotFoundError naming it if absent."""
    program = shutil.which(command[0], path=env.get("PATH")) or command[0]
    if not os.path.exists(program):
        raise FileNotFoundError(f"unstall run: command not found: {command[0]!r}")
    os.execve(program, list(command), env)
