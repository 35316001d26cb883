"""Test and benchmark helpers that ship with unstall: a real S3 server and a delaying proxy.

`SeaweedServer` runs SeaweedFS on free local ports; `DelayProxy` adds latency
and faults between a client and it. `unstall bench s3` and the tests use both.
"""

from unstall.testing.proxy import DelayProxy
from unstall.testing.seaweed import SeaweedServer, find_weed

__all__ = ["DelayProxy", "SeaweedServer", "find_weed"]
