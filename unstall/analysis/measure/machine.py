"""The node the job was measured on: its cores, the room a cache would have, its GPU decode.

Read once, with the runs, so that the stages after the measurement price configurations
on the machine as measured and never look at it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from unstall import machine


@dataclass(frozen=True)
class Machine:
    """Attributes:
    cores: cores this process may use (`unstall.machine.cores_available`: affinity and
        the cgroup's CPU quota, as the tuner counts them).
    cache_room_bytes: free shared memory (less `unstall.machine.SHM_RECOMMEND_MARGIN`) or
        half the available RAM, the smaller (None: not readable here).
    cuda: a CUDA device is usable.
    gpu_decoder: the GPU decoder GPU prep would use, by name (None: none installed).
    """

    cores: int
    cache_room_bytes: float | None
    cuda: bool
    gpu_decoder: str | None


def read_machine(cuda: bool | None = None) -> Machine:
    """This node as it is now; ``cuda`` as the job's process found it (None: asked here, which
    imports torch)."""
    usable = cuda_usable() if cuda is None else cuda
    return Machine(machine.cores_available(), _cache_room(), usable, _gpu_decoder(usable))


def _cache_room() -> float | None:
    try:
        free = machine.free_bytes() - machine.SHM_RECOMMEND_MARGIN
    except OSError:
        return None
    available = machine.memory_available_bytes()
    return free if available is None else min(free, available // 2)


def cuda_usable() -> bool:
    """A CUDA device is usable in this process (imports torch): the job's process asks it for
    the analyzer, whose own process then need not import torch (`read_machine`'s ``cuda``)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no usable torch.cuda: no CUDA
        return False


def _gpu_decoder(cuda: bool) -> str | None:
    """The GPU decoder GPU prep would use: measured on the CUDA device where there is one
    (`unstall.gpu.engine.available_decoder`, with torch), else named from what is installed."""
    try:
        if not cuda:
            from unstall.gpu.installed import installed_decoder

            return installed_decoder()
        from unstall.gpu.engine import available_decoder

        return available_decoder()
    except Exception:  # a broken optional package counts as none
        return None
