"""Storage backends: raw bytes by key. Pick one by URL with `open_store`."""

from unstall.stores.base import Store
from unstall.stores.local import LocalStore
from unstall.stores.opening import open_store

__all__ = ["LocalStore", "Store", "open_store"]
