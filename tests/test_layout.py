"""The layout rules of the package, checked on its source (README "Layout"):

- no module over 400 lines;
- ``__init__.py`` files only re-export: imports, ``__all__``, a docstring, or a lazy re-export
  (``_HOMES``, name -> module, served by ``__getattr__``) where import cost matters;
- no private name crosses a package: ``unstall.a`` neither imports ``_x`` (or a ``_module``)
  from ``unstall.b`` nor uses ``obj._x`` where ``_x`` is defined in ``unstall.b`` and not in
  ``unstall.a``;
- library code never imports ``unstall.bench``, ``unstall.cli`` or ``unstall.testing``.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "unstall"
MAX_LINES = 400
#: Packages that sit above the library: the library may not import them.
TOP = {"bench", "cli", "testing"}
#: A package may re-export lazily (``_HOMES`` + these): its names load on first use.
LAZY = {"__getattr__", "__dir__"}
#: The packages whose import cost matters enough for that (the root loads for every command).
LAZY_PACKAGES = {
    "unstall/__init__.py",
    "unstall/loader/__init__.py",  # the launcher checks a config file without torch
    "unstall/pipeline/__init__.py",
}
#: Packages that sit below the loader: they never import it.
BELOW_LOADER = {"errors", "models", "stores", "pipeline"}
#: Packages that serve the loader's options from above (`unstall.loader.extensions`).
ABOVE_LOADER = {"adapt", "gpu", "coordination", "remote", "distributed", "analysis", "launch", *TOP}


@functools.cache
def _modules() -> dict[str, ast.Module]:
    """Every module of the package, parsed once for all the tests here (read only)."""
    return {
        str(p.relative_to(ROOT.parent)): ast.parse(p.read_text(), str(p))
        for p in sorted(ROOT.rglob("*.py"))
    }


@functools.cache
def _walk(path: str) -> tuple[ast.AST, ...]:
    """Every node of one module (`_modules`), listed once for all the tests here."""
    return tuple(ast.walk(_modules()[path]))


def _package(path: str) -> str:
    """``unstall/cache/shm/x.py`` -> ``cache``; ``unstall/errors.py`` -> ``errors``."""
    parts = Path(path).parts
    return parts[1].removesuffix(".py") if len(parts) > 1 else ""


def _target_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "unstall" and len(parts) > 1 else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(tree: ast.Module):
    """(module, name or None, alias) for every import in ``tree``, wherever it stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name, alias.asname or alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, alias.asname or alias.name.split(".")[0]


def _getattr_private(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and _private(node.args[1].value)
    )


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_init_files_only_re_export():
    allowed = (ast.Import, ast.ImportFrom)
    bad = []
    for path, tree in _modules().items():
        if not path.endswith("__init__.py"):
            continue
        for i, node in enumerate(tree.body):
            if isinstance(node, allowed):
                continue
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            targets = node.targets if isinstance(node, ast.Assign) else []
            if [getattr(t, "id", None) for t in targets] in (
                ["__all__"],
                ["_HOMES"],
                ["__version__"],
            ):
                continue  # the names, and where each lazily re-exported one lives
            if isinstance(node, ast.FunctionDef) and node.name in LAZY:
                continue
            pair = targets[0] if len(targets) == 1 else None
            if isinstance(pair, ast.Tuple) and {getattr(t, "id", None) for t in pair.elts} <= LAZY:
                continue  # `unstall.lazy.lazy_exports`'s pair
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            bad.append(f"{path}:{node.lineno} {type(node).__name__}")
    assert bad == []


def test_no_private_name_is_imported_across_packages():
    """A private module crosses no package; a private name is imported only within the
    folder that defines it (``unstall.cache.shm`` takes none from ``unstall.cache``)."""
    bad = []
    for path, tree in _modules().items():
        here = _package(path)
        folder = ".".join(Path(path).with_suffix("").parts[:-1])
        for module, name, _alias in _imports(tree):
            there = _target_package(module)
            if there is None:
                continue
            modules = [p for p in module.split(".")[2:] if _private(p)]
            if modules and there != here:
                bad.append(f"{path}: {module}")
            source = module if name is None else module.rpartition(".")[0]
            if name and _private(name) and not source.startswith(folder):
                bad.append(f"{path}: {module} {name}")
    assert bad == []


def test_no_private_attribute_of_another_package_is_used():
    """``obj._x`` where ``_x`` is defined only in other packages (read from the definitions)."""
    modules = _modules()
    defined: dict[str, set[str]] = defaultdict(set)
    for path in modules:
        for node in _walk(path):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if _private(node.name):
                    defined[node.name].add(_package(path))
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _private(node.attr)
            ):
                defined[node.attr].add(_package(path))
    bad = []
    for path in modules:
        here = _package(path)
        for node in _walk(path):
            if _getattr_private(node):  # getattr(obj, "_x"): the same reach, spelled out
                name = node.args[1].value
                homes = defined.get(name, set())
                if homes and here not in homes:
                    bad.append(
                        f"{path}:{node.lineno} {ast.unparse(node)} (defined in {sorted(homes)})"
                    )
                continue
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                continue
            homes = defined.get(node.attr, set())
            if homes and here not in homes:
                bad.append(f"{path}:{node.lineno} {ast.unparse(node)} (defined in {sorted(homes)})")
    assert bad == []


def test_library_code_never_imports_bench_cli_or_testing():
    bad = []
    for path, tree in _modules().items():
        if _package(path) in TOP or path == "unstall/__main__.py":
            continue
        for module, _name, _alias in _imports(tree):
            if _target_package(module) in TOP:
                bad.append(f"{path}: {module}")
    assert bad == []


def test_the_loader_imports_nothing_above_it_and_nothing_below_imports_it():
    """Options served from above (GPU prep, coordination) plug in through the loader's
    extension registry; the packages below it never import it."""
    bad = []
    for path, tree in _modules().items():
        here = _package(path)
        for module, _name, _alias in _imports(tree):
            there = _target_package(module)
            if here == "loader" and there in ABOVE_LOADER:
                bad.append(f"{path}: {module}")
            if here in BELOW_LOADER and there == "loader":
                bad.append(f"{path}: {module}")
    assert bad == []


def _loader_private_names() -> set[str]:
    """The private attributes of a `DataLoader` and its iterators: those a live loader and
    its epoch iterator hold (torch's own included), and every ``self._x`` the loader's and
    the iterators' modules set."""
    import torch

    import unstall

    class Four(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return i

    loader = unstall.DataLoader(Four(), batch_size=2)
    it = iter(loader)
    names = {n for obj in (loader, it) for n in dir(obj) if _private(n)}
    for path in ("unstall/loader/dataloader.py", "unstall/loader/iterate.py"):
        for node in _walk(path):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


def test_nothing_outside_the_loader_reaches_into_the_loader_or_its_iterators():
    """Modules outside ``unstall/loader/`` use the loader's public entries only (e.g.
    `DataLoader.start_epoch`, ``it.cursor``), never ``loader._inner`` or ``it._cursor``;
    nor does the autotuner's pool change (``loader/autotune/pool.py``), which touches no
    private attribute at all."""
    names = _loader_private_names()
    assert {"_inner", "_sampler", "_handoff", "_position", "_cursor", "_torch_iter"} <= names
    bad = []
    for path in _modules():
        pool = path == "unstall/loader/autotune/pool.py"
        if path.startswith("unstall/loader/") and not pool:
            continue
        for node in _walk(path):
            if _getattr_private(node):
                name = node.args[1].value
            elif isinstance(node, ast.Attribute) and (
                _private(node.attr) or (pool and node.attr == "__dict__")
            ):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                    continue
                name = node.attr
            else:
                continue
            if pool or name in names:
                bad.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    assert bad == []


#: The one module that reads ``$UNSTALL_*`` variables (the machine's facts and settings).
ENV_OWNER = "unstall/machine.py"
#: Modules that run in every process of ``unstall run`` before (or instead of) loading
#: anything else of unstall (tests/launch/test_launch_cost.py): they read their own switch.
ENV_EXEMPT = {"unstall/launch/site/sitecustomize.py", "unstall/launch/boot.py"}


def _unstall_variable(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The ``UNSTALL_*`` name ``node`` spells: a string literal, or a module-level alias."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
    elif isinstance(node, ast.Name) and node.id in aliases:
        value = aliases[node.id]
    else:
        return None
    return value if value.startswith("UNSTALL_") and value[8:].replace("_", "").isalnum() else None


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def test_unstall_variables_are_read_only_by_the_machine_module():
    """No module but `unstall.machine` reads a ``$UNSTALL_*`` variable: no ``UNSTALL_*``
    name passed to a call (``os.environ.get``, ``os.getenv``, a helper of its own), looked
    up in ``os.environ`` (``os.environ[...]``, ``... in os.environ``) or bound to a module
    name (an alias read elsewhere). Setting one for a child process stays free."""
    bad = []
    for path, tree in _modules().items():
        if path == ENV_OWNER or path in ENV_EXEMPT:
            continue
        aliases = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value.value, str)
        }
        bad += [
            f"{path}: module name {k} = {v!r}"
            for k, v in aliases.items()
            if v.startswith("UNSTALL_")
        ]
        for node in _walk(path):
            found = None
            if isinstance(node, ast.Call):
                found = next((v for a in node.args if (v := _unstall_variable(a, aliases))), None)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                if _is_environ(node.value):
                    found = _unstall_variable(node.slice, aliases)
            elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                found = _unstall_variable(node.left, aliases)
            if found:
                bad.append(f"{path}:{node.lineno} reads {found}: ask unstall.machine")
    assert bad == []
