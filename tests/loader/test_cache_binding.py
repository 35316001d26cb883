"""``cache=`` resolved once (`unstall.loader.cache_binding`): what each value binds."""

from __future__ import annotations

import pytest

import unstall
from unstall.loader.cache_binding import resolve_cache
from unstall.stores.base import is_keyed, missing_method


class Plain:
    """A dataset that opens its files itself (none of fetch/key/fingerprint)."""

    def __len__(self) -> int:
        return 4


class Keyed(Plain):
    def fetch(self, indices):
        return [b"x" for _ in indices]

    def key(self, index):
        return str(index)

    def fingerprint(self):
        return "f"


class Forwarding:
    """A wrapper that forwards attributes: it is what it wraps."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_one_keyed_test():
    assert is_keyed(Keyed()) and is_keyed(Forwarding(Keyed()))
    assert not is_keyed(Plain()) and missing_method(Plain()) == "fetch"
    half = Keyed()
    half.key = None  # not callable
    assert missing_method(half) == "key"


def test_each_value_resolves_once():
    off = resolve_cache(False, Keyed())
    assert (off.cache, off.default, off.files) == (None, False, False)
    assert off.bind(Keyed()) is None
    default = resolve_cache(None, Keyed())
    assert (default.cache, default.default, default.files) == (None, True, False)
    assert not resolve_cache(None, Plain()).default  # a plain dataset: no cache code at all
    sized = resolve_cache("1MiB", Keyed())
    assert isinstance(sized.cache, unstall.Cache) and sized.cache.capacity == 1 << 20
    assert not sized.files
    files = resolve_cache(1 << 20, Plain())
    assert isinstance(files.cache, unstall.Cache) and files.files
    given = unstall.Cache("1MiB")
    assert resolve_cache(given, Keyed()).cache is given


def test_peers_are_read_from_the_binding():
    peers = object()
    cache = unstall.Cache("1MiB", peers=peers)
    assert resolve_cache(cache, Keyed()).peers is peers
    assert resolve_cache(cache, Plain()).peers is None  # files: node by node
    assert cache.peers is peers  # never swapped


def test_a_value_that_is_no_cache_is_named():
    with pytest.raises(TypeError, match=r"cache=True: pass unstall.Cache"):
        resolve_cache(True, Keyed())
