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
- an `unstall.Cache` with ``hold="samples"`` (or ``"decoded"``, ``"auto"``) for a map-style
  dataset: its prepared samples (or decoded images) cached, the dataset served through the
  cache (`unstall.cache.points`); one that cannot be gets its bytes cached instead, with
  one line saying which check failed.
- a dict (a config file's ``{"size": "8GiB", "hold": "samples"}``): ``Cache(**dict)``,
  ``size`` being the RAM tier's.
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
        points: what the cache holds of a map-style dataset's samples when not their
            bytes (``"samples"``, ``"decoded"``, ``"auto"``: `unstall.cache.points`); "".
    """

    cache: Any = None
    default: bool = False
    files: bool = False
    points: str = ""

    @property
    def peers(self) -> Any:
        """The peers the bound cache asks for items it does not own (None: node by node)."""
        if self.files or self.points or self.cache is None:
            return None
        return getattr(self.cache, "peers", None)

    def bind(self, dataset: Any) -> Any:
        """The loader's fetch layer for ``dataset`` (None: uncached). A file-level cache that
        cannot apply is None too, with one line saying why (never an error)."""
        if self.points:
            from unstall.cache.points import bind_points

            return bind_points(self.cache, dataset)
        if self.files:
            from unstall.cache.files import bind_files

            return bind_files(self.cache, dataset)
        if self.cache is not None:
            return self.cache.bind(dataset)
        if self.default:
            from unstall.cache.tiers import default_layer

            return default_layer(dataset)
        return None

    def serve(self, layer: Any, dataset: Any) -> Any:
        """The dataset the loader's tasks call: served through ``layer`` when it holds
        prepared samples, else ``dataset`` itself."""
        serve = getattr(layer, "serve", None) if self.points else None
        return dataset if serve is None else serve(dataset)


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
    if isinstance(cache, dict):
        return _from_dict(cache)
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
    hold = getattr(cache, "hold", "bytes") if is_setting(cache) else "bytes"
    if hold != "bytes" and _map_style(dataset):
        return CacheBinding(cache, points=hold)
    return CacheBinding(cache, files=is_setting(cache) and not is_keyed(dataset))


#: A config file's cache keys, and the `unstall.Cache` argument each sets.
_DICT_KEYS = {
    "size": "capacity",
    "ram": "ram",
    "disk": "disk",
    "hold": "hold",
    "deterministic": "deterministic",
    "keep": "keep",
    "name": "name",
}


def _from_dict(setting: dict[str, Any]) -> Any:
    """A config file's ``{"size": "8GiB", "hold": "samples", ...}`` as an `unstall.Cache`."""
    from unstall.cache import Cache

    unknown = sorted(set(setting) - set(_DICT_KEYS))
    if unknown:
        raise TypeError(
            f"cache={setting!r}: unknown keys {unknown}; a cache setting takes {sorted(_DICT_KEYS)}"
        )
    return Cache(**{_DICT_KEYS[k]: v for k, v in setting.items()})


def _map_style(dataset: Any) -> bool:
    """True for a dataset with a length and ``__getitem__`` (not an iterable one)."""
    import sys

    data = sys.modules.get("torch.utils.data")
    iterable = data is not None and isinstance(dataset, data.IterableDataset)
    return not iterable and hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def _is_size(cache: Any) -> bool:
    return isinstance(cache, (str, int, float)) and not isinstance(cache, bool)
