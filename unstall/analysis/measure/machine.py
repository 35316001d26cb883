"""The node the job was measured on: its cores, the room a cache would have, its GPU decode.

Read once, with the runs, so that the stages after the measurement price configurations
on the machine as measured and never look at it again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from unstall.analysis.measure.procstat import cores_available

#: Shared memory left free when sizing a recommended cache [Unit: byte].
SHM_MARGIN = 256 << 20


@dataclass(frozen=True)
class Machine:
    """Attributes:
    cores: cores this process may run on.
    cache_room_bytes: free shared memory (less ``SHM_MARGIN``) or half the free RAM,
        the smaller (None: not readable here).
    cuda: a CUDA device is usable.
    gpu_decoder: the GPU decoder GPU prep would use, by name (None: none installed).
    """

    cores: int
    cache_room_bytes: float | None
    cuda: bool
    gpu_decoder: str | None


def read_machine() -> Machine:
    """This node as it is now."""
    return Machine(cores_available(), _cache_room(), _cuda(), _gpu_decoder())


def _cache_room() -> float | None:
    try:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize - SHM_MARGIN
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // 2
    except (OSError, ValueError):
        return None
    return min(free, ram)


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no usable torch.cuda: no CUDA
        return False


def _gpu_decoder() -> str | None:
    try:
        from unstall.gpu import available_decoder

        return available_decoder()
    except Exception:  # a broken optional package counts as none
        return None
