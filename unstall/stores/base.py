"""The `Store` interface: raw bytes by key, one key or many at once; and `KeyedDataset`,
what a dataset over a store offers the loader and the cache."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from unstall.errors import MissingKeyError

if TYPE_CHECKING:
    import numpy as np

    from unstall.stores.listing import Listing


class Store(ABC):
    """Raw bytes by key from one storage location.

    Public methods validate and then call the backend's private ``_get``,
    ``_get_many``, ``_list`` and ``_put``. ``get_many`` exists so a backend can
    keep many requests in flight for a whole batch; results keep the keys' order.
    A store must be picklable: worker processes receive a copy and must open
    their own connections after fork (see ``__getstate__`` in backends).
    """

    #: URL scheme(s) this backend serves, e.g. ``("s3",)``; ``""`` means a plain path.
    schemes: tuple[str, ...] = ()

    @property
    @abstractmethod
    def url(self) -> str:
        """Where this store reads from, as a URL or path; used in messages and fingerprints."""

    def get(self, key: str) -> bytes:
        """Return the bytes stored under ``key``; raises `MissingKeyError` naming it."""
        _check_key(key, self.url)
        return self._get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """Return the bytes of every key, in the keys' order."""
        for key in keys:
            _check_key(key, self.url)
        return self._get_many(list(keys))

    #: True when `prefetch` does something: the loader then tells workers their next batch.
    prefetches = False

    def prefetch(self, keys: Sequence[str]) -> None:
        """Hint that ``keys`` will be asked for soon: a store that can starts fetching them.

        Never raises for a bad key and never changes what `get_many` returns;
        the default does nothing.
        """

    def list(self, prefix: str = "") -> list[str]:
        """Return every key under ``prefix``, sorted."""
        return sorted(self._list(prefix))

    def list_entries(self, prefix: str = "") -> Listing:
        """Every object under ``prefix`` with its size, mtime and version (`Listing`), sorted
        by key, listed now. Backends that cannot say raise NotImplementedError."""
        inner = getattr(self, "inner", None)
        if isinstance(inner, Store):
            return inner.list_entries(prefix)
        raise NotImplementedError(f"{type(self).__name__} cannot list versions")

    def versions(self, keys: Sequence[str]) -> np.ndarray | None:
        """The current version of each key (int64, `unstall.stores.listing`), or None if this
        store cannot say. Caches serve an item only under the version it was stored for."""
        inner = getattr(self, "inner", None)
        return inner.versions(keys) if isinstance(inner, Store) else None

    def read_ranges(
        self, items: Sequence[tuple[str, Sequence[tuple[int, int]], str | None]]
    ) -> list[list[bytes]]:
        """For each ``(key, [(start, end), ...], version or None)``, the bytes of its ranges;
        a key no longer at that version raises rather than give stale bytes. Backends that
        cannot read ranges raise NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot read byte ranges")

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (used to write synthetic datasets)."""
        _check_key(key, self.url)
        self._put(key, data)

    def close(self) -> None:
        """Release connections or files; safe to call twice."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # Backend hooks ------------------------------------------------------------
    @abstractmethod
    def _get(self, key: str) -> bytes: ...

    def _get_many(self, keys: list[str]) -> list[bytes]:
        return [self._get(key) for key in keys]

    @abstractmethod
    def _list(self, prefix: str) -> list[str]: ...

    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__} is read-only; cannot put {key!r}")


def _check_key(key: str, where: str) -> None:
    if not isinstance(key, str) or not key:
        raise MissingKeyError(f"invalid key {key!r} for store {where}: keys are non-empty strings")


class KeyedDataset(Protocol):
    """One of unstall's datasets over a store: raw bytes fetched by index, each item's key
    and a fingerprint naming the whole dataset (`unstall.FileDataset`, the shard datasets).

    What `unstall.Cache` binds (items cached by index, shared by fingerprint); a dataset
    without it opens its files itself, and a cache holds those files whole instead.
    `is_keyed` is the one test of it (by the methods, so wrappers that forward attributes
    count as what they wrap).
    """

    def fetch(self, indices: Sequence[int]) -> list[bytes]: ...

    def key(self, index: int) -> str: ...

    def fingerprint(self) -> str: ...


#: The methods of `KeyedDataset`.
KEYED_METHODS = ("fetch", "key", "fingerprint")


def missing_method(dataset: Any) -> str | None:
    """The first `KeyedDataset` method ``dataset`` lacks (None: it has them all)."""
    return next((m for m in KEYED_METHODS if not callable(getattr(dataset, m, None))), None)


def is_keyed(dataset: Any) -> bool:
    """True if ``dataset`` is a `KeyedDataset` (has callable fetch, key and fingerprint)."""
    return missing_method(dataset) is None
