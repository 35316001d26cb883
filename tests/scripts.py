"""A user script (or a docs generator) loaded as a module in the test's own process, without
running its ``__main__`` part: its Dataset classes and helpers, to check the script's own
output against what unstall served, or to time them apart from the analyzer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """The file at ``path`` imported as module ``name`` (not put in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
