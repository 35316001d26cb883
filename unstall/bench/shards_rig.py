"""`bench shards`' data and peers: the same images as raw objects, tar shards and MDS shards
on SeaweedFS, and the peers' own loaders (webdataset on the tars, Mosaic Streaming on MDS).

Mosaic's package imports torchvision at import time (``streaming/vision``), which
is not installed beside a CPU torch here: `import_streaming` puts a minimal
stand-in (a ``VisionDataset`` class, ``to_tensor``) in ``sys.modules`` first, only
when torchvision is missing. Nothing of it is used by the MDS reader.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import io
import os
import sys
import tarfile
import types
from pathlib import Path
from typing import Any

import torch.utils.data

SHARD_BYTES = 1 << 26  # 64 MiB, MDSWriter's default size_limit; the tars use the same
#: the proxy's delays, batch size and workers of both modes (`shards`, `shards_scale`)
LATENCIES_MS = (0, 20)
BATCH, WORKERS = 32, 2


def import_streaming() -> Any:
    """``streaming``, with a torchvision stand-in when torchvision is not installed; the
    stand-in leaves ``sys.modules`` once streaming is imported, so no other library (Lightning
    probes ``torchvision.models``) takes it for torchvision."""
    added: list[str] = []
    try:
        import torchvision  # noqa: F401
    except Exception:
        tv = types.ModuleType("torchvision")
        datasets = types.ModuleType("torchvision.datasets")
        transforms = types.ModuleType("torchvision.transforms")
        functional = types.ModuleType("torchvision.transforms.functional")

        class VisionDataset(torch.utils.data.Dataset):  # only subclassed by streaming.vision
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                pass

        def to_tensor(pic: Any) -> Any:
            raise RuntimeError("torchvision stand-in: to_tensor is not available")

        datasets.VisionDataset = VisionDataset  # type: ignore[attr-defined]
        functional.to_tensor = to_tensor  # type: ignore[attr-defined]
        tv.datasets, tv.transforms = datasets, transforms  # type: ignore[attr-defined]
        transforms.functional = functional  # type: ignore[attr-defined]
        for name, mod in (
            ("torchvision", tv),
            ("torchvision.datasets", datasets),
            ("torchvision.transforms", transforms),
            ("torchvision.transforms.functional", functional),
        ):
            # a spec, so importlib.util.find_spec (transformers probes it) does not fail
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
            if name not in sys.modules:
                sys.modules[name] = mod
                added.append(name)
    try:
        import streaming
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return streaming


def write_tars(images: list[tuple[str, bytes, int]], out: Path) -> list[Path]:
    """Tar shards as webdataset's ShardWriter lays them out (``<key>.jpg``, ``<key>.cls``),
    a new shard when one would pass ``SHARD_BYTES``."""
    out.mkdir(parents=True, exist_ok=True)
    groups: list[list[int]] = []
    size = SHARD_BYTES + 1
    for n, (_key, data, _label) in enumerate(images):
        if size + len(data) > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += len(data) + 1536
    paths = [out / f"train-{s:06d}.tar" for s in range(len(groups))]
    for path, numbers in zip(paths, groups, strict=True):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for n in numbers:
                _key, data, label = images[n]
                for ext, blob in (("jpg", data), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{n:06d}.{ext}")
                    info.size, info.mode, info.mtime = len(blob), 0o444, 1_700_000_000
                    tf.addfile(info, io.BytesIO(blob))
    return paths


def write_mds(images: list[tuple[str, bytes, int]], out: Path) -> list[Path]:
    """MDS shards made by Mosaic's own ``MDSWriter`` (columns key, image bytes, label)."""
    streaming = import_streaming()
    columns = {"key": "str", "image": "bytes", "label": "int"}
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=SHARD_BYTES) as writer:
        for n, (_key, data, label) in enumerate(images):
            writer.write({"key": f"{n:06d}", "image": data, "label": label})
    return sorted(p for p in out.iterdir() if p.is_file())


# webdataset's loader ------------------------------------------------------------------
def _boto3_client() -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=os.environ["S3_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
    )


_CLIENT: dict[int, Any] = {}


def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192) -> Any:
    """webdataset's opener for ``s3://``: boto3's streaming GET body (one GET per shard),
    as ``pipe:aws s3 cp ... -`` would do, without a subprocess."""
    pid = os.getpid()
    if pid not in _CLIENT:
        _CLIENT.clear()
        _CLIENT[pid] = _boto3_client()
    bucket, key = url[len("s3://") :].split("/", 1)
    body = _CLIENT[pid].get_object(Bucket=bucket, Key=key)["Body"]
    return body._raw_stream if hasattr(body, "_raw_stream") else body


def webdataset_loader(urls: list[str], batch_size: int, workers: int, seed: int) -> Any:
    """webdataset's own pipeline: shards shuffled and split by worker, a 1,000-sample
    shuffle buffer, ``(__key__, jpg)``; batched by torch's DataLoader."""
    import webdataset as wds
    from webdataset.gopen import gopen_schemes

    gopen_schemes["s3"] = gopen_s3
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False)
        .shuffle(1000)
        .to_tuple("__key__", "jpg")
    )
    return torch.utils.data.DataLoader(
        ds, batch_size=batch_size, num_workers=workers, collate_fn=_pairs
    )


def _pairs(batch: list[Any]) -> Any:
    return [bytes(x) for _k, x in batch]


# Mosaic Streaming ---------------------------------------------------------------------
def mosaic_loader(remote: str, local: str, batch_size: int, workers: int, seed: int) -> Any:
    """Mosaic Streaming's ``StreamingDataset`` over the MDS shards on S3 (its default
    shuffle, ``py1e``), read by torch's DataLoader as Mosaic documents."""
    streaming = import_streaming()

    class Pairs(streaming.StreamingDataset):  # type: ignore[misc, name-defined]
        def get_item(self, idx: int) -> Any:
            sample = super().get_item(idx)
            return sample["key"], sample["image"]

    ds = Pairs(remote=remote, local=local, shuffle=True, shuffle_seed=seed, batch_size=batch_size)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch_size, num_workers=workers, collate_fn=_pairs
    )
    return loader, ds


def clean_mosaic() -> None:
    """Remove Mosaic's shared memory left by a finished dataset (its own helper)."""
    with contextlib.suppress(Exception):
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()


def image_bytes(batch: list[Any]) -> list[bytes]:
    """Fetch-only batches: the image bytes (the same for every loader)."""
    return [bytes(x[0]) if isinstance(x, tuple) else bytes(x) for x in batch]
