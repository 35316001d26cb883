"""What each process of an ``unstall run`` does at start: swap the loader once torch loads.

Importing torch at start would cost every Python process of the run (shell helpers,
compilers) a second or more, so an import hook waits for the program's own
``import torch`` and swaps ``torch.utils.data.DataLoader`` right after it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
from typing import Any

_started = False


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so `_torch_loaded` runs after it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _torch_loaded()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def start() -> None:
    """Arrange the swap and the at-exit report in this process (idempotent)."""
    global _started
    if _started:
        return
    _started = True
    if "torch" in sys.modules:
        _torch_loaded()
    else:
        sys.meta_path.insert(0, _AfterTorch())
    atexit.register(_at_exit)


def _torch_loaded() -> None:
    from unstall.launch import report
    from unstall.loader.swap import patch_torch

    patch_torch()
    report.watch()
    if os.environ.get("UNSTALL_ANALYZE_MODE"):  # a run of `unstall analyze -- ...` (issue 17)
        from unstall.analysis.agent import install

        install()


def _at_exit() -> None:
    from unstall.launch import report

    try:
        report.write_own()
        if os.environ.get("UNSTALL_RUN_ROOT") == str(os.getpid()):
            report.print_summary()
    except Exception as exc:  # a report must never change the program's exit
        print(f"unstall run: no report ({exc!r})", file=sys.stderr)
