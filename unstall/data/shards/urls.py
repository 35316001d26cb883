"""Shard URLs: brace patterns (``train-{000000..000999}.tar``) and where the shards live.

A dataset's shards are keys under one location: a local directory or an
``s3://bucket/prefix``. `resolve` turns what the user wrote (a pattern, a list
of URLs, or the location itself) into that location and the shard keys.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_ALTERNATIVES = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in order.

    ``{000..012}`` is a zero-padded numeric range (the width of the first bound),
    ``{a,b}`` alternatives; several braces multiply out, as in the shell.
    """
    ranged, alts = _RANGE.search(pattern), _ALTERNATIVES.search(pattern)
    if ranged is not None and (alts is None or ranged.start() < alts.start()):
        lo, hi = ranged.group(1), ranged.group(2)
        if int(hi) < int(lo):
            raise ValueError(f"brace range {ranged.group(0)!r} in {pattern!r} counts down")
        width = len(lo)
        head, tail = pattern[: ranged.start()], pattern[ranged.end() :]
        out: list[str] = []
        for n in range(int(lo), int(hi) + 1):
            out.extend(expand(f"{head}{n:0{width}d}{tail}"))
        return out
    if alts is not None:
        head, tail = pattern[: alts.start()], pattern[alts.end() :]
        return [s for alt in alts.group(1).split(",") for s in expand(head + alt + tail)]
    return [pattern]


def resolve(
    source: str | os.PathLike[str] | Sequence[str], suffixes: tuple[str, ...]
) -> tuple[str, list[str] | None]:
    """(root location, shard keys relative to it) for a pattern, a list of URLs or a location.

    Keys are None when ``source`` is a location (directory or prefix) to be listed
    for files ending in one of ``suffixes``.
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        names = expand(text)
        if len(names) == 1 and not names[0].endswith(suffixes):
            return names[0].rstrip("/"), None  # a directory or prefix: list it
    else:
        names = [os.fspath(s) for s in source]
        if not names:
            raise ValueError("no shard URLs given: pass a pattern, a list of URLs or a directory")
    parents = {name.rsplit("/", 1)[0] if "/" in name else "." for name in names}
    root = _common_parent(sorted(parents))
    keys = [name[len(root) + 1 :] if root else name for name in names]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"shard {dup!r} is named twice in {source!r}")
    return root, keys


def _common_parent(parents: list[str]) -> str:
    """The longest '/'-separated prefix shared by all parents (never cutting a component)."""
    first = parents[0].split("/")
    n = len(first)
    for p in parents[1:]:
        parts = p.split("/")
        n = min(n, len(parts))
        for i in range(n):
            if parts[i] != first[i]:
                n = i
                break
    root = "/".join(first[:n])
    if root.endswith(":/") or root.endswith(":"):
        raise ValueError(f"shards {parents[:3]} share no bucket: put a dataset's shards in one")
    return root
