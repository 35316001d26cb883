"""Run PyTorch's own DataLoader tests with `unstall.DataLoader` in torch's place.

The tests are torch's ``test/test_dataloader.py`` (pytorch/pytorch, BSD-3-Clause; not
vendored here): give its path. They run under ``unstall run``, so every process they start
(spawned workers' parents, ``subprocess`` children) builds unstall's loaders too::

    python -m tests.loader.torch_suite /path/to/test_dataloader.py [pytest args...]

It needs ``expecttest`` (torch's test helpers import it). The exit status is pytest's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: What `tests/loader/test_torch_suite.py` reads the test file's path from.
ENV = "UNSTALL_TORCH_TESTS"


def run(path: str | Path, args: list[str], *, timeout: float | None = None):
    """torch's tests at ``path`` under ``unstall run``: the finished process (output captured)."""
    path = Path(path).resolve()
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])  # this checkout's unstall, then torch's tests
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [here, env.get("PYTHONPATH"), str(path.parent)])
    )
    pytest = [sys.executable, "-m", "pytest", str(path), "-p", "no:cacheprovider", *args]
    command = [sys.executable, "-m", "unstall", "run", "--", *pytest]
    return subprocess.run(
        command, cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout
    )


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    done = run(sys.argv[1], sys.argv[2:] or ["-q", "-rfE"])
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
