"""The loader's edges: what it imports, and what its neighbours import of it."""

from __future__ import annotations

import ast
import pathlib

import unstall

ROOT = pathlib.Path(unstall.__file__).parent


def imports_of(package: str) -> list[tuple[str, str, list[str]]]:
    """``(module file, imported module, names)`` for every import under ``unstall/<package>``."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((str(path.relative_to(ROOT)), node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                out.extend((str(path.relative_to(ROOT)), a.name, []) for a in node.names)
    return out


def test_no_private_name_is_imported_across_packages():
    wrong = []
    for package in ("loader", "coordination", "models"):
        for where, module, names in imports_of(package):
            if not module.startswith("unstall.") or module.split(".")[1] == package:
                continue
            private = [n for n in names if n.startswith("_")]
            private += [p for p in module.split(".") if p.startswith("_")]
            if private:
                wrong.append((where, module, private))
    assert wrong == []


def test_the_loader_plugs_in_the_gpu_stage_and_coordination_and_models_stay_below_it():
    above = {"gpu", "coordination", "analysis", "launch", "bench", "cli", "testing"}
    loader = {(w, m) for w, m, _ in imports_of("loader") if set(m.split(".")[1:2]) & above}
    assert loader == set()
    models = {(w, m) for w, m, _ in imports_of("models") if m.startswith("unstall.loader")}
    assert models == set()


def test_init_files_only_re_export():
    for package in ("loader", "loader/handoff", "coordination", "models"):
        tree = ast.parse((ROOT / package / "__init__.py").read_text())
        kinds = {type(n).__name__ for n in tree.body} - {"Expr", "ImportFrom", "Import"}
        targets = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
        assert kinds <= {"Assign"} and targets in ([], ["__all__"]), package
