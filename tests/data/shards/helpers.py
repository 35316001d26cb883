"""Shards made by the tests: tars laid out as webdataset's ShardWriter writes them, and the
same samples unpacked as files, plus loaders that collate to sample numbers."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path
from typing import Any

import torch

SHARDS, PER_SHARD = 4, 12


def sample_bytes(n: int, seed: int = 0) -> bytes:
    """The "image" of sample ``n``: random bytes of a random size (distinct per sample)."""
    rng = random.Random(seed * 1_000_003 + n)
    return f"sample {n} ".encode() + rng.randbytes(rng.randint(50, 4000))


def write_tar(path: Path, numbers: list[int], seed: int = 0) -> None:
    """A tar shard as ShardWriter lays it out: per sample ``<key>.jpg``, ``.cls``, ``.json``,
    consecutive, ustar headers (mode 0444, uname "bigdata", as webdataset's TarWriter)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for n in numbers:
            key = f"s{n:06d}"
            fields = (
                ("jpg", sample_bytes(n, seed)),
                ("cls", str(n).encode()),
                ("json", b'{"n": %d}' % n),
            )
            for ext, data in fields:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mode, info.uname, info.gname = (
                    len(data),
                    0o444,
                    "bigdata",
                    "bigdata",
                )
                info.mtime = 1_700_000_000
                tf.addfile(info, io.BytesIO(data))


def make_tars(root: Path, *, shards: int = SHARDS, per_shard: int = PER_SHARD, seed: int = 0):
    """``shards`` tar files ``train-000000.tar`` ... under ``root``; returns their paths."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = root / f"train-{s:06d}.tar"
        write_tar(path, list(range(s * per_shard, (s + 1) * per_shard)), seed)
        paths.append(path)
    return paths


def unpack(paths: list[Path], dest: Path) -> dict[str, bytes]:
    """The tars unpacked into files (``dest/<key>.<ext>``); returns path -> bytes."""
    out = {}
    for p in paths:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                data = tf.extractfile(m).read()  # type: ignore[union-attr]
                (dest / m.name).parent.mkdir(parents=True, exist_ok=True)
                (dest / m.name).write_bytes(data)
                out[m.name] = data
    return out


def ids_collate(batch: list[Any]) -> torch.Tensor:
    """A batch of ``(image bytes, label)``: the labels, which are the sample numbers.
    The bytes are checked against the sample's own number on the way."""
    for x, y in batch:
        assert bytes(x).startswith(f"sample {y} ".encode()), (bytes(x)[:20], y)
    return torch.tensor([y for _, y in batch])


def epoch_ids(loader: Any) -> list[int]:
    return [i for b in loader for i in b.tolist()]


def env_without_cache(tmp: Path) -> dict[str, str]:
    return {**os.environ, "UNSTALL_CACHE_DIR": str(tmp)}


def write_mds(out: Path, numbers: list[list[int]], seed: int = 0) -> list[Path]:
    """MDS shards by the published layout (streaming's MDS format, version 2): per shard
    ``shard.<s>.mds`` = uint32 count, uint32 offsets, samples; ``index.json`` naming them.
    Columns as MDSWriter sorts them: image (bytes), key (str), label (int)."""
    import json
    import struct

    out.mkdir(parents=True, exist_ok=True)
    shards, paths = [], []
    for s, group in enumerate(numbers):
        samples = []
        for n in group:
            image, key = sample_bytes(n, seed), f"s{n:06d}".encode()
            head = struct.pack("<II", len(image), len(key))
            samples.append(head + image + key + struct.pack("<q", n))
        start = 4 * (len(samples) + 2)
        offsets = [start]
        for data in samples:
            offsets.append(offsets[-1] + len(data))
        blob = struct.pack(f"<I{len(offsets)}I", len(samples), *offsets) + b"".join(samples)
        name = f"shard.{s:05d}.mds"
        (out / name).write_bytes(blob)
        paths.append(out / name)
        shards.append({
            "column_encodings": ["bytes", "str", "int"],
            "column_names": ["image", "key", "label"],
            "column_sizes": [None, None, 8],
            "compression": None,
            "format": "mds",
            "hashes": [],
            "raw_data": {"basename": name, "bytes": len(blob), "hashes": {}},
            "samples": len(samples),
            "size_limit": 1 << 26,
            "version": 2,
            "zip_data": None,
        })  # fmt: skip
    (out / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return [out / "index.json", *paths]
