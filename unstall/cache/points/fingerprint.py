"""The fingerprint of a dataset's preparation: what a cached sample was made by.

An entry of the sample (or decoded) cache is keyed by its file's version (size, mtime,
inode) and by this fingerprint, so a changed transform, a changed loader function or a
new unstall gives new entries, never old ones; jobs whose preparation is the same get
the same fingerprint and share entries. It digests:

- the dataset's class: its qualified name and the source of every class in its MRO
  (the bytecode where no source can be read), and the code of the module-level
  functions its methods call (followed two levels deep);
- the dataset's attributes: small values by their ``repr`` (addresses removed), large
  lists and arrays by a digest of their contents, transforms and loader functions by
  their class and parameters (a torchvision transform's ``repr`` names its
  parameters; other objects give their attributes) and their code;
- the versions of the libraries its code refers to (``soundfile``, ``soxr``, ``PIL``,
  ``torchvision``...: a new resampler can change the output);
- unstall's own version and the source of the code that makes and stores the entry
  (the encoding, the sample cache, the split of a transform).

The paths of the files the dataset lists are part of it as well (`unstall.cache.points.
samples`): a dataset over other files is another dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import sys
import types
import weakref
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

#: Lists and arrays longer than this are digested, not written out.
_LARGE = 64
#: How deep attributes and called functions are followed.
_DEPTH = 3
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
#: Classes whose source says nothing about a dataset's preparation.
_SKIP_CLASSES = ("builtins.object", "typing.Generic", "torch.utils.data.dataset.Dataset")


def preparation_fingerprint(dataset: Any, *extra: str, ignore: Collection[str] = ()) -> str:
    """A hex digest of ``dataset``'s preparation (module notes) and of ``extra`` strings;
    the attributes named in ``ignore`` are left out (state that ``extra`` stands for)."""
    digest = hashlib.blake2b(digest_size=16)
    seen: set[int] = set()
    for part in (_unstall_part(), *extra, *_describe_dataset(dataset, seen, ignore)):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def describe(obj: Any, depth: int = _DEPTH, seen: set[int] | None = None) -> str:
    """``obj`` as a stable string: its class and parameters, and its code where it has some."""
    seen = set() if seen is None else seen
    return "".join(_parts(obj, depth, seen))


#: The modules of this package whose code makes a cached sample: read from their files, not
#: imported (they import this module: an import here would close a circle).
_PRODUCERS = ("codec.py", "samples.py", "decoded.py")


def _unstall_part() -> str:
    import unstall

    here = Path(__file__).parent
    code = " ".join(_file_digest(here / name) for name in _PRODUCERS)
    return f"unstall {unstall.__version__} {code}"


def _file_digest(path: Path) -> str:
    try:
        return _digest(path.read_bytes())
    except OSError:
        return "?"


def _describe_dataset(dataset: Any, seen: set[int], ignore: Collection[str] = ()) -> list[str]:
    cls = type(dataset)
    out = [_class_part(cls, seen)]
    attrs = getattr(dataset, "__dict__", {})
    for name in sorted(set(attrs) - set(ignore)):
        out.append(f"{name}=" + "".join(_parts(attrs[name], _DEPTH, seen)))
    return out


def _parts(obj: Any, depth: int, seen: set[int]) -> list[str]:
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        text = repr(obj)
        return [text if len(text) < 4096 else _digest(text.encode())]
    if isinstance(obj, (list, tuple)):
        if len(obj) > _LARGE:
            return [f"{type(obj).__name__}[{len(obj)}]:{_digest(repr(obj).encode())}"]
        return ["[", *[p for v in obj for p in (*_parts(v, depth - 1, seen), ",")], "]"]
    if isinstance(obj, (set, frozenset)):  # sorted: a set's order changes with the hash seed
        return [f"{type(obj).__name__}:", *sorted(repr(v) for v in obj)]
    if isinstance(obj, dict):
        items = list(obj.items())
        if len(items) > _LARGE:
            return [f"dict[{len(items)}]:{_digest(repr(items).encode())}"]
        return ["{", *[p for k, v in items for p in (repr(k), ":", *_parts(v, depth - 1, seen))]]
    if isinstance(obj, np.ndarray):
        return [f"ndarray{obj.shape}{obj.dtype.str}:{_array_digest(obj)}"]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        array = obj.detach().cpu().contiguous()
        data = array.view(torch.uint8).numpy() if array.numel() else np.zeros(0)
        return [f"tensor{tuple(obj.shape)}{obj.dtype}:{_array_digest(data)}"]
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return [_function_part(obj, depth, seen)]
    if isinstance(obj, types.ModuleType):
        return [_module_part(obj)]
    if isinstance(obj, type):
        return [_class_part(obj, seen)]
    if id(obj) in seen or depth <= 0:
        return [f"<{_qualname(type(obj))}>"]
    seen.add(id(obj))
    out = [_class_part(type(obj), seen), _ADDRESS.sub("", _safe_repr(obj))]
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for name in sorted(attrs):
            if not name.startswith("__"):
                out += [f".{name}=", *_parts(attrs[name], depth - 1, seen)]
    if callable(obj) and not isinstance(attrs, dict):
        call = vars(type(obj)).get("__call__")
        if isinstance(call, types.FunctionType):
            out.append(_function_part(call, depth - 1, seen))
    return out


def _class_part(cls: type, seen: set[int]) -> str:
    if id(cls) in seen:
        return f"class {_qualname(cls)}"
    seen.add(id(cls))
    parts = [f"class {_qualname(cls)}"]
    for base in cls.__mro__:
        name = _qualname(base)
        if name in _SKIP_CLASSES or base.__module__ == "builtins":
            continue
        parts.append(f"{name}:{_code_digest(base)}")
        module = sys.modules.get(base.__module__)
        for attr in vars(base).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, types.FunctionType):
                parts.append(_called(attr, module, _DEPTH - 1, seen))
    return " ".join(parts)


def _function_part(fn: Any, depth: int, seen: set[int]) -> str:
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:  # a builtin: its module's version names it
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        return f"builtin {getattr(fn, '__qualname__', repr(fn))} {_module_part(module)}"
    parts = [f"def {getattr(fn, '__module__', '')}.{fn.__qualname__}:{_code_digest(fn)}"]
    parts.append(repr(getattr(fn, "__defaults__", None)))
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            parts.extend(_parts(cell.cell_contents, depth - 1, seen))
    parts.append(_called(fn, sys.modules.get(fn.__module__ or ""), depth - 1, seen))
    return " ".join(parts)


def _called(fn: types.FunctionType, module: Any, depth: int, seen: set[int]) -> str:
    """The functions, classes and modules ``fn``'s code names from its module's globals."""
    if depth <= 0 or module is None:
        return ""
    names = set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    out = []
    glob = getattr(module, "__dict__", {})
    for name in sorted(names):
        value = glob.get(name)
        if isinstance(value, types.ModuleType):
            out.append(_module_part(value))
        elif isinstance(value, types.FunctionType) and id(value) not in seen:
            seen.add(id(value))
            out.append(_function_part(value, depth, seen))
        elif isinstance(value, type) and getattr(value, "__module__", "") == module.__name__:
            out.append(_class_part(value, seen))
    return " ".join(out)


def _module_part(module: Any) -> str:
    """A module by its package's name and version (its code is the version's)."""
    if module is None:
        return "module ?"
    top = module.__name__.split(".")[0]
    package = sys.modules.get(top)
    version = getattr(package, "__version__", None) or getattr(module, "__version__", None)
    if version is None and getattr(module, "__file__", None) and top not in sys.stdlib_module_names:
        return f"module {module.__name__}:{_source_digest(module)}"
    return f"module {top} {version}"


#: Each class's and function's code digest, once per object: a class's source is found by
#: parsing its whole module (2-3 s of a binding's fingerprint, for torchvision's transforms).
#: A redefined function or class is another object, digested afresh.
_code_digests: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _code_digest(obj: Any) -> str:
    try:
        return _code_digests[obj]
    except (KeyError, TypeError):  # not yet; or an object that takes no weak reference
        pass
    out = _code_digest_of(obj)
    with contextlib.suppress(TypeError):
        _code_digests[obj] = out
    return out


def _code_digest_of(obj: Any) -> str:
    try:
        return _digest(inspect.getsource(obj).encode())
    except (OSError, TypeError):
        code = getattr(obj, "__code__", None)
        if code is not None:
            names = repr((code.co_consts, code.co_names)).encode()
            return _digest(code.co_code + names)
        return _digest(repr(sorted(vars(obj))).encode()) if isinstance(obj, type) else "?"


def _source_digest(module: Any) -> str:
    try:
        return _digest(inspect.getsource(module).encode())
    except (OSError, TypeError):
        return "?"


def _array_digest(a: np.ndarray) -> str:
    return _digest(np.ascontiguousarray(a).tobytes())


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:
        return f"<{_qualname(type(obj))}>"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
