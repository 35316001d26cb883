"""What one of the job's batches would cost to ship from a remote worker (issue 45).

Timed on a real batch of the job (the synthetic run's): its bytes as `unstall.remote.wire`
ships them, and the training process's CPU to receive it (`from_wire`: each array copied
out of the read-only object store into the process's own memory). What the analyzer cannot
see from one machine is left out and said so by the remote remedy: the network between
the nodes, and Ray's own cost per object fetched.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from unstall.models.batch import batch_size_of
from unstall.remote.wire import from_wire, to_wire, walk

#: Times the receive is repeated (median): a batch is copied in milliseconds.
REPEATS = 5


def wire_probe(batch: Any) -> dict[str, Any] | None:
    """``bytes_per_sample`` and ``receive_cpu_s_per_sample`` of ``batch`` (its tensors on the
    host, as a remote worker hands them), the median of `REPEATS` receives on this thread's
    CPU clock; None for a batch with no samples or no tensors."""
    samples = batch_size_of(batch)
    payload, nbytes = to_wire(_on_host(batch))
    if samples < 1 or nbytes <= 0:
        return None
    times = []
    for _ in range(REPEATS):
        t0 = time.thread_time()
        from_wire(payload)
        times.append(time.thread_time() - t0)
    receive = statistics.median(times)
    return {
        "samples": samples,
        "batch_bytes": nbytes,
        "bytes_per_sample": nbytes / samples,
        "receive_cpu_s_per_sample": receive / samples,
        "repeats": REPEATS,
    }


def _on_host(batch: Any) -> Any:
    """``batch`` with its device tensors copied to the host (remote batches travel there)."""

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.cpu()
        return x

    return walk(leaf, batch)
