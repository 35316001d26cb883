"""The cache's and the peers' packages keep their layout: re-exporting ``__init__`` files, no
private name taken from another package, small modules, tiers behind one interface."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import unstall
from unstall.cache.disk_tier import DiskTier
from unstall.cache.ram_tier import RamTier
from unstall.cache.tier import Tier

ROOT = Path(unstall.__file__).parent
PACKAGES = ("cache", "distributed")


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _package_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1])


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_layout(path: Path):
    tree = ast.parse(path.read_text())
    assert len(path.read_text().splitlines()) <= 400
    if path.name == "__init__.py":  # docstring, imports and __all__ only
        for node in tree.body:
            assert isinstance(node, ast.Expr | ast.Import | ast.ImportFrom | ast.Assign), (
                f"{path}:{node.lineno} is more than a re-export"
            )
    own = _package_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("unstall"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            source = node.module if not private else node.module.rpartition(".")[0]
            if private and not source.startswith(own):
                pytest.fail(f"{path}:{node.lineno} imports {private} from {node.module}")


def test_both_tiers_are_tiers():
    args = dict(path=None, name="n", group=1, owner=1, capacity=0, how="off")
    for tier in (RamTier(policy="noevict", **args), DiskTier(**args)):
        assert isinstance(tier, Tier)
        assert tier.get_many([0, 1], None) == ([None, None], 0)
        assert tier.put_many([(0, b"x")], None, 0) == (0, 0)
        assert tier.stats()["enabled"] is False
        assert tier.close() is False
