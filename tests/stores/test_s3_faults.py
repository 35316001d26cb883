"""Faults between the loader and S3: retried exactly, or a clear error naming the key, no hang."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import pytest

import unstall
from unstall.errors import SampleError
from unstall.stores.s3_errors import classify
from unstall.testing import DelayProxy


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def test_5_percent_faults_lose_and_duplicate_nothing(s3_data, s3_env, seaweed):
    faults = ("503", "reset", "truncate")
    with DelayProxy(seaweed.endpoint, delay=0.002, fail_rate=0.05, faults=faults, seed=7) as px:
        s3_env(px.endpoint, max_inflight=32)
        keys = s3_data.keys
        dataset = unstall.FileDataset(
            s3_data.url, keys, labels=list(range(len(keys))), transform=sha256
        )
        loader = unstall.DataLoader(
            dataset,
            batch_size=32,
            shuffle=True,
            num_workers=4,
            collate_fn=as_list,
            cache=False,  # both epochs from the store (no default disk tier)
        )
        for _ in range(2):
            got = [sample for batch in loader for sample in batch]
            assert sorted(i for _, i in got) == list(range(len(keys)))
            assert all(digest == s3_data.digests[keys[i]] for digest, i in got)
    injected = sum(px.stats.faults.values())
    assert set(px.stats.faults) == set(faults) and injected >= 20, px.stats.faults
    stats = loader.stats()["store"]
    assert stats["errors"] == 0
    assert stats["retries"] == injected  # each fault costs exactly one retry, nothing more
    assert stats["requests"] == 2 * len(keys) + injected


def test_persistent_503_reaches_training_loop_with_key(s3_data, s3_env, seaweed):
    with DelayProxy(seaweed.endpoint, fail_rate=1.0, faults=("503",)) as px:
        s3_env(px.endpoint, retries=2, max_inflight=8)
        loader = unstall.DataLoader(
            unstall.FileDataset(s3_data.url, s3_data.keys[:16]),
            batch_size=8,
            num_workers=2,
            collate_fn=as_list,
        )
        start = time.monotonic()
        with pytest.raises(SampleError) as info:
            list(loader)
    message = str(info.value)
    assert f"sample 0 (key '{s3_data.keys[0]}')" in message, message
    failed = re.search(r"giving up on key '([^']+)' in bucket '([^']+)'", message)
    assert failed and failed[1] in s3_data.keys[:8] and failed[2] == s3_data.bucket, message
    assert "after 3 attempts" in message and "503" in message
    assert time.monotonic() - start < 30


def test_timeout_is_bounded_and_names_the_key(s3_data, s3_env, seaweed):
    with DelayProxy(seaweed.endpoint, delay=3.0) as px:
        s3_env(px.endpoint, retries=1, timeout=0.3, max_inflight=4)
        loader = unstall.DataLoader(
            unstall.FileDataset(s3_data.url, s3_data.keys[:4]),
            batch_size=4,
            num_workers=1,
            collate_fn=as_list,
        )
        start = time.monotonic()
        with pytest.raises(SampleError) as info:
            list(loader)
        elapsed = time.monotonic() - start
    message = str(info.value)
    assert f"sample 0 (key '{s3_data.keys[0]}')" in message, message
    failed = re.search(r"giving up on key '([^']+)' in bucket '([^']+)'", message)
    assert failed and failed[1] in s3_data.keys[:4] and failed[2] == s3_data.bucket, message
    assert "after 2 attempts" in message and "timed out" in message.lower(), message
    assert elapsed < 20, f"took {elapsed:.1f} s"


def test_proxy_faults_are_deterministic_per_seed():
    def draws(seed: int) -> list[str | None]:
        proxy = DelayProxy(("127.0.0.1", 1), fail_rate=0.05, faults=("503", "reset"), seed=seed)
        return [proxy.choose_fault(f"GET /b/k{i} HTTP/1.1".encode()) for i in range(4000)]

    first, again, other = draws(1), draws(1), draws(2)
    assert first == again and first != other
    failed = sum(d is not None for d in first)
    assert 140 <= failed <= 260  # ~5 % of 4000
    assert {d for d in first if d} == {"503", "reset"}


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FileNotFoundError("Object at location k not found"), "missing"),
        (OSError("Server returned non-2xx status code: 503 Service Unavailable"), "retry"),
        (OSError("Server returned non-2xx status code: 429 Too Many Requests"), "retry"),
        (OSError("Server returned non-2xx status code: 400 Bad Request"), "fatal"),
        (OSError("Server returned non-2xx status code: 403 Forbidden"), "denied"),
        (OSError("error sending request: connection reset by peer"), "retry"),
        (TimeoutError(), "retry"),
        (ValueError("bad"), "fatal"),
    ],
)
def test_classify(error: BaseException, kind: str):
    assert classify(error) == kind
