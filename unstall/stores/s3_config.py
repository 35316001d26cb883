"""Settings of an S3 store: URL, endpoint, region and credentials, resolved once.

Values come from, in order: the options passed to `S3Store`, the usual AWS
environment variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``
...), then the shared config files (``~/.aws/credentials``, ``~/.aws/config``,
profile ``AWS_PROFILE``). What obstore can find by itself (instance metadata,
web identity) is left to it.
"""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Settings:
    """Everything a process needs to build its own client; picklable, built in the parent.

    Args:
        bucket: bucket name.
        prefix: key prefix inside the bucket, without slashes at either end ('' for none).
        endpoint: endpoint URL for S3-compatible servers, or None for AWS.
        region: region name.
        config: extra obstore ``S3Config`` keys (credentials, ...), as sorted items.
        timeout: seconds one request may take before it is retried [Unit: second].
        retries: retries per key after the first attempt, for retryable failures.
        max_inflight: requests in flight per process; None: chosen from measured latency.
        target_rate: requests/s per process that the default ``max_inflight`` aims for.
    """

    bucket: str
    prefix: str
    endpoint: str | None
    region: str
    config: tuple[tuple[str, str], ...] = ()
    timeout: float = 30.0
    retries: int = 6
    max_inflight: int | None = None
    target_rate: float = 2000.0
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout} must be > 0 seconds")
        if self.retries < 0:
            raise ValueError(f"retries={self.retries} must be >= 0; use 0 to never retry")
        if self.max_inflight is not None and not 1 <= self.max_inflight <= 4096:
            raise ValueError(
                f"max_inflight={self.max_inflight} must be in [1, 4096], or None to choose "
                "it from the measured latency"
            )
        if self.target_rate <= 0:
            raise ValueError(f"target_rate={self.target_rate} must be > 0 requests/s")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def where(self, key: str) -> str:
        """``s3://bucket/prefix/key``, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def obstore_kwargs(self, *, pid: int) -> dict[str, Any]:
        """Keyword arguments of `obstore.store.S3Store` for this process."""
        config: dict[str, Any] = {"region": self.region, **dict(self.config)}
        if self.endpoint:
            config["endpoint"] = self.endpoint
        client: dict[str, Any] = {
            "timeout": timedelta(seconds=self.timeout),
            "connect_timeout": timedelta(seconds=min(self.timeout, 5.0)),
            # names the process in server logs; tests use it to prove no connection is shared
            "user_agent": f"unstall pid/{pid}",
            "pool_max_idle_per_host": "1024",
        }
        if self.endpoint and self.endpoint.startswith("http://"):
            client["allow_http"] = True
        return {
            "prefix": self.prefix or None,
            "config": config,
            "client_options": client,
            # unstall retries itself, to count retries and bound them per key
            "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=self.timeout)},
        }


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not url.startswith(("s3://", "s3a://")):
        raise ValueError(f"{url!r} is not an S3 URL; expected s3://bucket/prefix")
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"S3 URL {url!r} has no bucket; expected s3://bucket/prefix")
    return bucket, prefix.strip("/")


def resolve(
    url: str,
    *,
    endpoint: str | None,
    region: str | None,
    config: dict[str, str] | None,
    **options: Any,
) -> S3Settings:
    """Build `S3Settings` from options, then environment, then AWS config files."""
    bucket, prefix = parse_url(url)
    profile = _profile()
    endpoint = (
        endpoint
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("AWS_ENDPOINT")
        or profile.get("endpoint_url")
    )
    region = (
        region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or profile.get("region")
        or DEFAULT_REGION
    )
    merged = dict(config or {})
    if "access_key_id" not in merged and not os.environ.get("AWS_ACCESS_KEY_ID"):
        for ours, theirs in (
            ("access_key_id", "aws_access_key_id"),
            ("secret_access_key", "aws_secret_access_key"),
            ("session_token", "aws_session_token"),
        ):
            if profile.get(theirs):
                merged[ours] = profile[theirs]
    return S3Settings(
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=region,
        config=tuple(sorted(merged.items())),
        **options,
    )


def _profile() -> dict[str, str]:
    """The active profile's values from ``~/.aws/config`` and ``~/.aws/credentials``."""
    name = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    out: dict[str, str] = {}
    files = (
        (os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"), f"profile {name}"),
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), name),
    )
    for path, section in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(os.path.expanduser(path))
        except configparser.Error:
            continue
        for candidate in (section, name):
            if parser.has_section(candidate):
                out.update(parser.items(candidate))
                break
    return out
