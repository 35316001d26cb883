"""Opening a store by URL: the scheme picks the backend, imported only when used."""

from __future__ import annotations

import importlib
import os

from unstall.stores.base import Store

# scheme -> "module:Class"; imported lazily so optional SDKs load only when used.
_BACKENDS: dict[str, str] = {
    "": "unstall.stores.local:LocalStore",
    "file": "unstall.stores.local:LocalStore",
    "s3": "unstall.stores.s3:S3Store",
}


def open_store(source: str | os.PathLike[str] | Store, **options: object) -> Store:
    """Return a `Store` for a path or URL (``/data/train``, ``s3://bucket/prefix``).

    A `Store` passed in is returned unchanged. ``options`` go to the backend.
    """
    if isinstance(source, Store):
        return source
    text = os.fspath(source)
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme not in _BACKENDS:
        known = ", ".join(sorted(s + "://" for s in _BACKENDS if s))
        raise ValueError(f"unknown storage URL scheme {scheme!r} in {text!r}; known: {known}")
    module_name, cls_name = _BACKENDS[scheme].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(text, **options)
