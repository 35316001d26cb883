"""How an S3 request failed, from the client's exception: retry it, give up, or GET plainly.

obstore raises a few typed exceptions (404, 403) and a generic one with the
HTTP status and object_store's message in its text for the rest, so both are read.
"""

from __future__ import annotations

import asyncio
import re

_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")
#: How the client says a server did not answer a range request with that range (object_store's
#: messages: its error types are not exposed): the server ignores ``Range``, so GET plainly.
_RANGE_IGNORED = (
    "non-partial response when range requested",
    "Content-Range header",
    "CONTENT_RANGE header",
)
_UNEXPECTED_RANGE = re.compile(r"Requested \d+\.\.\d+, got \d+\.\.\d+")


def classify(exc: BaseException) -> str:
    """``missing`` (404), ``denied`` (401/403), ``retry`` (timeout, reset, 5xx, 429), ``fatal``."""
    import obstore.exceptions as oe

    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError, PermissionError)):
        return "denied"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return "retry"
    if isinstance(exc, (oe.BaseError, OSError)):
        status = http_status(exc)
        if status is not None:
            if status in (401, 403):
                return "denied"
            if status == 404:
                return "missing"
            return "retry" if status >= 500 or status in (408, 429) else "fatal"
        return "retry"  # no HTTP status: connection reset, truncated body, timeout
    return "fatal"


def range_refused(exc: BaseException) -> str | None:
    """Why a ranged GET of a whole object failed where a plain GET may not: ``"empty"`` (416:
    an empty object has no byte 0), ``"ignored"`` (the server does not do ranges), else None."""
    if isinstance(exc, FileNotFoundError):
        return None
    if http_status(exc) == 416:
        return "empty"
    text = str(exc)
    if any(m in text for m in _RANGE_IGNORED) or _UNEXPECTED_RANGE.search(text):
        return "ignored"
    return None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status the client's message names, or None (no response: reset, timeout)."""
    match = _STATUS.search(str(exc))
    return int(match.group(1) or match.group(2)) if match else None


def short(exc: BaseException | None) -> str:
    """The exception's first line, type first, at most 300 characters (for error messages)."""
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "none"
    return text.split("\n", 1)[0][:300]
