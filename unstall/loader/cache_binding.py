"""A loader's ``cache=`` argument, resolved once into what gets bound (`CacheBinding`).

`resolve_cache` is called by `unstall.loader.settings.LoaderSettings.resolve` (and for an
iterable dataset, or a config file's setting, by the file hook and the analyzer): the
argument and the dataset decide it once, and the loader, the file hook and the peers read
the result.

- ``False``: no cache.
- ``None`` (not given): the loader's default, for one of unstall's datasets
  (`unstall.stores.base.KeyedDataset`): a disk tier when its store is remote
  (`unstall.cache.tiers.default_layer`); none for any other dataset, which then loads no
  cache code at all.
- a size (``"16GiB"``, a config file's number): ``Cache(size)``, made here (`cache_of`).
- an `unstall.Cache`: bound to the dataset's items for one of unstall's datasets; bound to
  the files it lists for a dataset that opens its files itself, served to its own
  ``open(path, "rb")`` in the workers (`unstall.cache.files`, `unstall.loader.file_hook`).
  Files are cached node by node: peers (``Cache(peers=...)``) serve unstall's datasets only.
- any other object with ``bind(dataset)``: bound as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unstall.stores.base import is_keyed


@dataclass(frozen=True)
class CacheBinding:
    """What a loader's ``cache=`` binds (see the module notes).

    Attributes:
        cache: the cache to bind (a size made into a `Cache` already); None: none given.
        default: the loader's default applies (``cache=None`` and one of unstall's
            datasets): a disk tier for remote data.
        files: the dataset opens its files itself: ``cache`` holds them whole, served by
            the workers' ``open`` hook.
    """

    cache: Any = None
    default: bool = False
    files: bool = False

    @property
    def peers(self) -> Any:
        """The peers the bound cache asks for items it does not own (None: node by node)."""
        return None if self.files or self.cache is None else getattr(self.cache, "peers", None)

    def bind(self, dataset: Any) -> Any:
        """The loader's fetch layer for ``dataset`` (None: uncached). A file-level cache that
        cannot apply is None too, with one line saying why (never an error)."""
        if self.files:
            from unstall.cache.files import bind_files

            return bind_files(self.cache, dataset)
        if self.cache is not None:
            return self.cache.bind(dataset)
        if self.default:
            from unstall.cache.tiers import default_layer

            return default_layer(dataset)
        return None


def is_setting(cache: Any) -> bool:
    """True if ``cache`` is a cache setting: an `unstall.Cache` or a size."""
    if _is_size(cache):
        return True
    if cache is None or cache is False:
        return False
    from unstall.cache import Cache

    return isinstance(cache, Cache)


def cache_of(cache: Any) -> Any:
    """``cache`` as an object to bind: a size becomes ``Cache(size)`` (the one place it does);
    an object with ``bind`` is kept.

    Raises:
        TypeError: naming the value and what ``cache=`` takes.
        ValueError: a size that cannot be read (from `unstall.Cache`).
    """
    if _is_size(cache):
        from unstall.cache import Cache

        return Cache(cache)  # a RAM tier's size, as a config file's "cache" key gives it
    if not callable(getattr(cache, "bind", None)):
        raise TypeError(
            f"cache={cache!r}: pass unstall.Cache(...), a RAM size such as '16GiB', "
            "None (a disk tier for remote data) or False (no cache)"
        )
    return cache


def resolve_cache(cache: Any, dataset: Any) -> CacheBinding:
    """The binding of a loader's ``cache=`` argument for ``dataset`` (module notes)."""
    if cache is False:
        return CacheBinding()
    if cache is None:
        return CacheBinding(default=is_keyed(dataset))
    cache = cache_of(cache)
    return CacheBinding(cache, files=is_setting(cache) and not is_keyed(dataset))


def _is_size(cache: Any) -> bool:
    return isinstance(cache, (str, int, float)) and not isinstance(cache, bool)
