"""Started by Python in every process of an ``unstall run`` (this folder is on PYTHONPATH)."""

import os
import sys


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved, module = list(sys.path), sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        try:  # noqa: SIM105 (contextlib is not imported yet in every process)
            __import__("sitecustomize")
        except ImportError:  # none to chain to
            pass
    finally:
        sys.path[:] = saved
        if module is not None:
            sys.modules["sitecustomize"] = module


_chain()
if os.environ.get("UNSTALL_RUN_DIR"):
    try:
        from unstall.launch import boot

        boot.start()
    except Exception as exc:  # never break the user's program
        print(f"unstall run: could not start in pid {os.getpid()}: {exc!r}", file=sys.stderr)
