"""Errors raised by unstall: each names the sample, key or setting at fault."""

from __future__ import annotations


class UnstallError(Exception):
    """Base class of every error unstall raises on purpose."""


class SampleError(UnstallError):
    """Loading one sample failed; the message names its dataset index and key.

    Raised in the training loop for a failure inside a worker (the worker's
    traceback follows in the message), or directly with ``num_workers=0``.
    """

    def __init__(self, message: str, *, index: int | None = None, key: str | None = None):
        super().__init__(message)
        self.index = index
        self.key = key


class StoreError(UnstallError):
    """A storage backend failed for a key after its retries; names store and key."""

    def __init__(self, message: str, *, key: str | None = None, store: str | None = None):
        super().__init__(message)
        self.key = key
        self.store = store


class MissingKeyError(StoreError):
    """A key does not exist in its store (404, missing file). Never retried."""


class AccessDeniedError(StoreError):
    """The store refused access to a key or bucket (403). Never retried."""


class EmptyDatasetError(UnstallError):
    """A listing or key list held no samples, so there is nothing to train on."""
