"""torch's DataLoader internals are reached through one adapter (unstall/loader/workers/
torch_iter.py): no other module of unstall names a private attribute of torch's loader or
its iterators, and the adapter's names hold on the installed torch."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.utils.data.dataloader as torch_dataloader

import unstall
from unstall.loader.workers import torch_iter

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "unstall/loader/workers/torch_iter.py"
#: Modules of torch whose private names only the adapter imports.
TORCH_MODULES = ("torch.utils.data", "torch.utils.data.dataloader", "torch.utils.data._utils")
_CLASSES = (
    torch_dataloader.DataLoader,
    torch_dataloader._BaseDataLoaderIter,
    torch_dataloader._SingleProcessDataLoaderIter,
    torch_dataloader._MultiProcessingDataLoaderIter,
)


def _torch_private_names() -> set[str]:
    """Every private attribute of torch's loader and iterators: those their classes define
    and those their code sets on ``self`` (``self.__x`` as Python mangles it)."""
    names: set[str] = set()
    for cls in _CLASSES:
        names |= {n for n in vars(cls) if n.startswith("_") and not n.endswith("__")}
        for name in re.findall(r"self\.(_\w+)", inspect.getsource(cls)):
            names.add(f"_{cls.__name__}{name}" if name.startswith("__") else name)
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of ``tree`` (words about torch, not uses of it)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def _uses(path: Path, names: set[str]) -> list[str]:
    """Where module ``path`` names one of ``names`` on an object that is not its own
    (``x._name`` for any ``x`` but ``self``/``cls``, a string ``"_name"`` as in
    ``getattr(x, "_name")`` or ``vars(x)["_name"]``), or imports a private name of torch's
    loader modules."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value in names and id(node) not in docs:
            found.append(f"{node.lineno} {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module in (
            *TORCH_MODULES,
            "torch.utils.data",
        ):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.lineno} from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(TORCH_MODULES[2]):
                    found.append(f"{node.lineno} import {alias.name}")
    return found


def test_the_scan_sees_the_names_it_is_for():
    """The scan's list holds the names torch's iterator machinery is known by, and finds
    each way of naming one (a fixture module, not unstall's)."""
    names = _torch_private_names()
    assert {
        "_iterator",
        "_base_seed",
        "_IterableDataset_len_called",
        "_workers",
        "_index_queues",
        "_shutdown_workers",
        "_task_info",
        "_DataLoader__initialized",
    } <= names
    assert set(torch_iter.NAMES) <= names  # the adapter's own are torch's, as it says


def test_the_scan_flags_each_way_of_naming_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads ``_workers`` (a docstring: words, not a use)."""\n'
        "from torch.utils.data import _utils\n"
        "from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter\n"
        "def f(it, loader):\n"
        "    it._workers\n"
        "    getattr(loader, '_iterator', None)\n"
        "    loader.__dict__['_DataLoader__initialized'] = True\n"
        "    it._unstall_watch = 1\n"  # unstall's own name on torch's object: not torch's
        "class C:\n"
        "    def g(self):\n"
        "        return self._workers\n"  # a class's own attribute of the same name
    )
    assert sorted(_uses(module, _torch_private_names())) == [
        "2 from torch.utils.data import _utils",
        "3 from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter",
        "5 it._workers",
        "6 '_iterator'",
        "7 '_DataLoader__initialized'",
    ]


def test_no_module_but_the_adapter_names_a_private_attribute_of_torchs_loader():
    """Every private name of torch's DataLoader, its iterators and their worker machinery
    is read or written in unstall/loader/workers/torch_iter.py alone."""
    names = _torch_private_names()
    bad = []
    for path in sorted((ROOT / "unstall").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == ADAPTER:
            continue
        bad += [f"{rel}:{use}" for use in _uses(path, names)]
    assert bad == []


def test_the_adapters_names_hold_on_the_installed_torch():
    """`check` passes here, and each name it checks is really where it says."""
    torch_iter.check.cache_clear()
    torch_iter.check()
    for name, (cls, why) in torch_iter.NAMES.items():
        assert why
        assert callable(getattr(cls, name, None)) or torch_iter._set_in_source(cls, name), name


def test_the_check_cuts_each_class_from_its_module_without_parsing_it(monkeypatch):
    """Each class's block is its source as `inspect.getsource` gives it, and the check finds
    every name there: it never asks `inspect.getsource` for a class (which parses the whole
    module on each call: 0.8 s of CPU a process for these names)."""
    for cls in {cls for cls, _ in torch_iter.NAMES.values()}:
        assert torch_iter._class_block(cls).rstrip() == inspect.getsource(cls).rstrip()
    asked: list[object] = []
    real = inspect.getsource

    def counting(obj: object) -> str:
        asked.append(obj)
        return real(obj)

    monkeypatch.setattr(torch_iter.inspect, "getsource", counting)
    torch_iter._class_block.cache_clear()
    torch_iter.check.cache_clear()
    try:
        torch_iter.check()
    finally:
        torch_iter.check.cache_clear()
    assert asked and not [obj for obj in asked if isinstance(obj, type)]
    # a name the cut lacks is still looked for in the class's whole source
    cls = torch_dataloader._MultiProcessingDataLoaderIter
    monkeypatch.setattr(torch_iter, "_class_block", lambda _cls: "")
    assert torch_iter._set_in_source(cls, "_workers") is True
    assert isinstance(asked[-1], type)


def test_a_moved_name_raises_an_error_naming_it(monkeypatch):
    """A torch without one of the names: `check` raises `TorchInternalsError` naming the
    attribute, torch's class and what unstall uses it for."""
    monkeypatch.setitem(
        torch_iter.NAMES,
        "_gone_in_a_new_torch",
        (torch_dataloader._MultiProcessingDataLoaderIter, "x"),
    )
    torch_iter.check.cache_clear()
    try:
        with pytest.raises(torch_iter.TorchInternalsError) as err:
            torch_iter.check()
    finally:
        torch_iter.check.cache_clear()
    message = str(err.value)
    assert "'_gone_in_a_new_torch'" in message
    assert "_MultiProcessingDataLoaderIter" in message
    assert torch.__version__ in message
    assert "torch>=2.1" in message


def test_the_adapter_reads_a_running_pool():
    """Through the adapter: a loader's workers (their pids), the tasks in flight and the
    base seed, on a real two-worker epoch; all gone once its iterator is shut down."""

    class Eight(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

    loader = unstall.DataLoader(Eight(), batch_size=2, num_workers=2, seed=3)
    it = iter(loader)
    raw = it.workers_iter
    try:
        assert next(it).tolist() == list(loader.sampler)[:2]
        pids = [w.pid for w in torch_iter.workers(raw)]
        assert len(pids) == 2 and sorted(pids) == sorted(loader.worker_pids())
        assert isinstance(torch_iter.base_seed(raw), int)
        assert torch_iter.tasks_sent(raw) >= torch_iter.waiting_for(raw) >= 1
        assert all(torch_iter.worker_active(raw, w) for w in range(2))
        assert torch_iter.is_torch_iter(raw) and not torch_iter.persistent(raw)
    finally:
        torch_iter.shutdown_workers(raw)
        loader.close()
    assert torch_iter.is_shut_down(raw)
    assert all(not w.is_alive() for w in torch_iter.workers(raw))
