"""``.npz`` tables (shard indexes, shard manifests, folder indexes) read whole, safely from
any thread.

numpy parses each array's header with ``ast.literal_eval``. On CPython before 3.12 the AST
constructor keeps one recursion counter for every thread, so two threads parsing at once can
fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905): the
S3 helper indexes shards from its download threads, and one such error failed a download in
the suite. Every read goes through one lock here, so the headers are parsed one at a time.
"""

from __future__ import annotations

import io
import os
import threading

import numpy as np

_PARSE = threading.Lock()


def read_npz(source: bytes | str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` in ``source`` (its bytes, or a path), by name.

    Raises what ``np.load`` raises for a missing or malformed file; never unpickles."""
    f = io.BytesIO(source) if isinstance(source, bytes) else source
    with _PARSE, np.load(f, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}
