"""What each process of an ``unstall run`` does at start: swap the loader once it is named.

Importing torch at start would cost every Python process of the run (shell helpers,
compilers) a second or more, so an import hook waits for the program's own
``import torch``. Even then, loading unstall's loader (numpy, its machinery) would
cost a process that imports torch but makes no DataLoader a tenth of a second, so
the hook only makes ``torch.utils.data.DataLoader`` a name resolved on first use
(a module ``__getattr__``): the first lookup (``from torch.utils.data import
DataLoader`` included) does the swap and starts the report.
"""

from __future__ import annotations

import atexit
import os
import sys

TYPE_CHECKING = False  # typing and importlib.abc are left unimported: this runs in every process
if TYPE_CHECKING:
    from typing import Any

_started = False


class _After:
    """A meta path finder that finds nothing itself; wraps module ``name``'s loader so
    ``then(module)`` runs right after the module is executed (once)."""

    def __init__(self, name: str, then: Any):
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        import importlib.util

        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.then(module)

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
        sys.meta_path.insert(0, _After("torch", lambda _module: _torch_loaded()))
    # a script that makes unstall.DataLoader itself never looks up torch's: its first loader
    # starts the swap (the hooks module is tiny; importing the loader here would cost)
    hooks = sys.modules.get("unstall.loader.hooks")
    if hooks is not None:
        hooks.before_first_loader(_swap_now)
    else:
        sys.meta_path.insert(
            0, _After("unstall.loader.hooks", lambda mod: mod.before_first_loader(_swap_now))
        )
    atexit.register(_at_exit)


def _torch_loaded() -> None:
    """Defer the swap to the first lookup of ``torch.utils.data.DataLoader``."""
    module = sys.modules.get("torch.utils.data")
    if module is None or "DataLoader" not in vars(module):
        _swap_now()
        return
    original = vars(module).pop("DataLoader")
    previous = vars(module).get("__getattr__")

    def __getattr__(name: str) -> Any:
        if name == "DataLoader":
            return _swap_now()
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module 'torch.utils.data' has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    _deferred[:] = [module, original, previous]


_deferred: list[Any] = []  # [torch.utils.data, torch's DataLoader, its own __getattr__]
_swapping = False
_swapped = False


def _swap_now() -> Any:
    """Undo the deferral, swap in unstall's DataLoader and start the report; returns the
    class ``torch.utils.data.DataLoader`` now names."""
    global _swapping, _swapped
    if _deferred:
        module, original, previous = _deferred
        _deferred.clear()
        module.DataLoader = original
        if previous is None:
            vars(module).pop("__getattr__", None)
        else:
            module.__getattr__ = previous
    if _swapping or _swapped:  # looked up while unstall's loader is being imported (torch's
        return sys.modules["torch.utils.data"].DataLoader  # own), or swapped already
    _swapping = True
    try:
        _swap()
        _swapped = True
    finally:
        _swapping = False
    return sys.modules["torch.utils.data"].DataLoader


def _swap() -> None:
    from unstall.launch import report, state
    from unstall.loader.swap import patch_torch

    patch_torch()
    report.watch()
    state.install()  # SIGUSR1: what this process's loaders are doing
    run_boot_hooks()


#: ``module:function`` entries (comma-separated) each process calls once the loader is
#: swapped in: how a layer above (``unstall analyze``'s agent) joins a run without the
#: launcher importing it.
BOOT_HOOKS = "UNSTALL_BOOT_HOOKS"


def run_boot_hooks() -> None:
    import importlib

    for entry in filter(None, os.environ.get(BOOT_HOOKS, "").split(",")):
        module, _, name = entry.strip().partition(":")
        getattr(importlib.import_module(module), name or "install")()


def _at_exit() -> None:
    root = os.environ.get("UNSTALL_RUN_ROOT") == str(os.getpid())
    if not root and "unstall.launch.report" not in sys.modules:
        return  # made no loader, and prints no summary: nothing to do
    from unstall.launch import report

    try:
        report.write_own()
        if root:
            report.print_summary()
    except Exception as exc:  # a report must never change the program's exit
        print(f"unstall run: no report ({exc!r})", file=sys.stderr)
