"""Batches prepared on other machines: Ray actors fed by the loader's own dispatcher."""

from unstall.remote.settings import Remote

__all__ = ["Remote"]
