"""Serving a dataset's own file reads from the node cache, inside the loader's workers.

A dataset that is not one of unstall's (no ``fetch``/``key``/``fingerprint``) opens its
files itself: ``open(path, "rb")``, ``PIL.Image.open(path)``, ``np.load(path)``,
``torch.load(path)``. With a cache set, `worker_init` (chained before the user's
``worker_init_fn``) installs a hook on ``builtins.open`` / ``io.open`` in each worker
(in the main process itself when there are none). It serves a call only when all hold:

- mode ``"rb"`` (no text mode, no writing, appending or updating), default buffering or a
  size, no ``opener``, and a path (not a descriptor);
- the path is one the dataset lists (`unstall.cache.files.FileCache.index_of`), so reads
  of anything else (``/proc``, ``/dev``, ``/sys``, the script's own files) are untouched;
- the file, as opened, is a regular file of at most ``MAX_FILE_BYTES``.

It opens the real file, takes its version by ``fstat``, and returns a `CachedFile`
(an `io.BytesIO` holding exactly the file's bytes, read-only, with ``name`` and
``mode``): from the cache when it holds that version, else read whole from the file
and stored. Everything else gets the real file object, as without unstall. A
`CachedFile` asked for ``fileno()`` (``mmap``, ``np.load(mmap_mode=...)``,
``os.read``) opens the real file at its position and from then on behaves as it.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import weakref
from collections.abc import Callable
from typing import Any

from unstall.cache.files import FileCache, is_regular
from unstall.loader.cache_binding import is_setting, resolve_cache

#: The real ``open``, captured before any hook.
real_open = io.open
#: The caches served in this process (weakly: a loader collected takes its cache along).
_caches: list[weakref.ref[FileCache]] = []


class CachedFile(io.BytesIO):
    """A file's bytes as a read-only binary file (see the module notes)."""

    def __init__(self, data: bytes, name: Any, reopen: Any):
        super().__init__(data)
        self.name, self.mode = name, "rb"
        self._reopen = reopen
        self._real: Any = None

    def fileno(self) -> int:
        """The real file's descriptor: the real file is opened at this position, and serves
        every later call."""
        if self._real is None:
            real = real_open(self._reopen, "rb")
            real.seek(super().tell())
            self._real = real
        return self._real.fileno()

    def read(self, size: int | None = -1) -> bytes:
        return self._real.read(size) if self._real is not None else super().read(size)

    def read1(self, size: int = -1) -> bytes:
        return self._real.read1(size) if self._real is not None else super().read1(size)

    def readinto(self, buffer: Any) -> int:
        return self._real.readinto(buffer) if self._real is not None else super().readinto(buffer)

    def readline(self, size: int | None = -1) -> bytes:
        return self._real.readline(size) if self._real is not None else super().readline(size)

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        return self._real.readlines(hint) if self._real is not None else super().readlines(hint)

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._real.seek(pos, whence) if self._real is not None else super().seek(pos, whence)

    def tell(self) -> int:
        return self._real.tell() if self._real is not None else super().tell()

    def peek(self, size: int = 0) -> bytes:
        """As `io.BufferedReader.peek`: bytes ahead, without moving."""
        if self._real is not None:
            return self._real.peek(size)
        pos = super().tell()
        out = super().read(max(size, 1) if size > 0 else 4096)
        super().seek(pos)
        return out

    def writable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        raise io.UnsupportedOperation("write")

    def writelines(self, lines: Any) -> None:
        raise io.UnsupportedOperation("write")

    def truncate(self, size: int | None = None) -> int:
        raise io.UnsupportedOperation("truncate")

    def close(self) -> None:
        if self._real is not None:
            self._real.close()
        super().close()

    def __repr__(self) -> str:
        return f"<unstall CachedFile name={self.name!r} mode='rb'>"


def _hooked(
    file: Any,
    mode: str = "r",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    closefd: bool = True,
    opener: Callable[..., int] | None = None,
) -> Any:
    """``open`` with whole-file reads of listed files served from the cache (module notes)."""
    if (
        _caches
        and (mode == "rb" or mode == "br")
        and buffering != 0
        and encoding is None
        and errors is None
        and newline is None
        and opener is None
        and closefd
        and isinstance(file, (str, bytes, os.PathLike))
    ):
        found = _find(file)
        if found is not None:
            return _serve(file, *found)
    return real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)


def _find(file: Any) -> tuple[FileCache, int] | None:
    """The cache and item of ``file`` if a bound cache lists it."""
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(file)))
        if path.startswith(("/proc/", "/dev/", "/sys/")):
            return None
        for ref in _caches:
            cache = ref()
            index = cache.index_of(path) if cache is not None else None
            if index is not None:
                return cache, index
    except (TypeError, ValueError, OSError):
        pass
    return None


def _serve(file: Any, cache: FileCache, index: int) -> Any:
    """The file's bytes as a `CachedFile`, or the real file when it cannot be served."""
    f = real_open(file, "rb")  # the real file's own errors, as without the hook
    try:
        fd = f.fileno()
        st = os.fstat(fd)
        if not is_regular(st) or st.st_size > cache.max_bytes:
            return f
        data, stored = cache.read(index, st, f.read, lambda: os.fstat(fd))
        if stored:  # the cache holds it now: the page cache need not as well
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        name = f.name
    except Exception:  # the cache failed (not the file): the real file, from its start
        with contextlib.suppress(Exception):
            f.seek(0)
            return f
        raise
    f.close()
    return CachedFile(data, name, file)


def install(cache: FileCache) -> None:
    """Serve ``cache``'s files in this process (idempotent)."""
    if all(ref() is not cache for ref in _caches):
        _caches.append(weakref.ref(cache, _forget))
    builtins.open = _hooked
    io.open = _hooked


def uninstall(cache: FileCache) -> None:
    """Stop serving ``cache``'s files here; the real ``open`` is back once none is left."""
    _caches[:] = [ref for ref in _caches if ref() is not cache and ref() is not None]
    if not _caches:  # (at interpreter exit builtins may have lost ``open`` already)
        if getattr(builtins, "open", None) is _hooked:
            builtins.open = real_open
        if getattr(io, "open", None) is _hooked:
            io.open = real_open


def _forget(ref: weakref.ref[FileCache]) -> None:
    """A cache served here was collected: drop it (and the hook, if it was the last)."""
    _caches[:] = [r for r in _caches if r is not ref and r() is not None]
    if not _caches:
        uninstall(None)  # type: ignore[arg-type]


class WorkerInit:
    """A worker's init function: install the hook for ``cache``, then run the user's (if any).
    A class (not a closure) so that spawned workers can unpickle it."""

    def __init__(self, cache: FileCache, user: Callable[[int], None] | None):
        self.cache, self.user = cache, user

    def __call__(self, worker_id: int) -> None:
        install(self.cache)
        if self.user is not None:
            self.user(worker_id)


def worker_init(
    cache: Any, user: Callable[[int], None] | None, num_workers: int
) -> Callable[[int], None] | None:
    """The ``worker_init_fn`` to give torch: ``user``'s, chained after installing the hook
    when ``cache`` is a `FileCache` (or holds one as ``files``: mixed placement's byte part,
    `unstall.cache.points.placement`); with no workers the hook is installed here now (and
    removed when the cache closes)."""
    if not isinstance(cache, FileCache):
        cache = getattr(cache, "files", None)
    if not isinstance(cache, FileCache):
        return user
    if num_workers == 0:
        install(cache)
        cache.on_close.append(uninstall)
        return user
    return WorkerInit(cache, user)


def for_passthrough(a: dict[str, Any], dataset: Any, torch_loader: Any) -> FileCache | None:
    """An iterable dataset's cache (torch's own loader runs it): its files cached as above,
    the hook chained into ``torch_loader``'s workers; ``a["cache"]`` is then taken as handled.
    None (``a`` untouched) when ``a["cache"]`` is not a cache setting for a dataset that
    opens its files itself (`unstall.loader.cache_binding`)."""
    if not is_setting(a["cache"]):
        return None
    binding = resolve_cache(a["cache"], dataset)
    if not binding.files:
        return None
    files = binding.bind(dataset)
    a["cache"] = None
    init = worker_init(files, torch_loader.worker_init_fn, torch_loader.num_workers)
    torch_loader.worker_init_fn = init
    return files
