"""The machine's facts and the process's environment, each read in one place.

Every other part asks here: the cores this process may use (the one counter: its affinity,
capped by a cgroup's CPU quota), the node's memory, the cache and shared-memory directories,
every ``$UNSTALL_*`` variable, torchrun's (the rank, the place in the job) and Ray's
``$RAY_ADDRESS``: one small typed function each (tests/test_layout.py, test_environment.py).
Read when asked, never at import: a test that sets a variable for a while is seen at once.
S3's ``$AWS_*`` stay with the S3 configuration (`unstall.stores.s3_config`, boto3's order).

The bottom floor, beside `unstall.errors`: the standard library only, cheap to import.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import NamedTuple

#: The cache directory when ``$UNSTALL_CACHE_DIR`` is not set.
DEFAULT_CACHE_DIR = "~/.cache/unstall"
#: The shared-memory directory when ``$UNSTALL_SHM_DIR`` is not set.
DEFAULT_SHM_DIR = "/dev/shm"
#: Shared memory a new RAM tier leaves free when it is sized to what is free: room for
#: the loader's slots and other small segments [Unit: byte].
SHM_OPEN_MARGIN = 16 << 20
#: Shared memory the analyzer leaves free when it sizes the cache it recommends: the job
#: itself needs some (slots, other jobs' segments) while the cache fills [Unit: byte].
SHM_RECOMMEND_MARGIN = 256 << 20
#: The variable that forces the GPU prep engine (``dali`` or ``torch``).
PREP_ENGINE_ENV = "UNSTALL_PREP_ENGINE"
#: The variable naming how DALI is fed (`unstall.gpu.dali_feed.FEEDS`; unset: tensors).
DALI_FEED_ENV = "UNSTALL_DALI_FEED"


def _env(name: str) -> str:
    return os.environ.get(name, "")


def _int_env(name: str) -> int | None:
    """``$name`` as a whole number; None when unset or not one."""
    value = _env(name).strip()
    return int(value) if value.isdigit() else None


def _number(name: str, kind: type, default: float | None = None) -> float | None:
    """``$name`` as ``kind``; ``default`` when unset or empty; a ValueError naming it."""
    text = _env(name)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} must be {kind.__name__}") from None


# The machine -------------------------------------------------------------------------------
def cores_available() -> int:
    """CPUs this process may use: its affinity (a cpuset included), capped by a cgroup's CPU
    quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded up. At least 1."""
    cores = len(cpu_set())
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cpu_set(pid: int = 0) -> set[int]:
    """The CPUs process ``pid`` (0: this one) may run on (its affinity; all where unreadable):
    for pinning; the cores a process may use are `cores_available`."""
    try:
        return set(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return set(range(cpus_installed()))


def cpus_installed() -> int:
    """The machine's CPUs, to describe it; never to size a pool (`cores_available`)."""
    return os.cpu_count() or 1


class CpuTicks(NamedTuple):
    """CPU time of the cores this process may run on, since boot [Unit: clock tick]."""

    busy: int  # running anything (user, nice, system, irq, softirq, steal)
    idle: int  # idle or waiting on I/O


def cpu_ticks() -> CpuTicks | None:
    """`CpuTicks` summed over the CPUs of this process's affinity, from ``/proc/stat``'s
    per-CPU lines; None where not readable. A job pinned to some cores (``taskset``, a
    cpuset) sees what runs on those, not the load on cores it cannot use (the whole-machine
    line would count that as contention)."""
    mine = {f"cpu{c}" for c in cpu_set()}
    busy = idle = 0
    seen = False
    try:
        with open("/proc/stat", "rb") as f:
            for raw in f:
                if not raw.startswith(b"cpu"):
                    break
                name, *fields = raw.split()
                if name == b"cpu" or (mine is not None and name.decode() not in mine):
                    continue
                values = [int(x) for x in fields[:8]]
                free = values[3] + (values[4] if len(values) > 4 else 0)
                busy += sum(values) - free
                idle += free
                seen = True
    except (OSError, ValueError):
        return None
    return CpuTicks(busy, idle) if seen else None


def clock_tick_s() -> float:
    """Seconds per ``/proc/stat`` clock tick."""
    return 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _cgroup_quota() -> float | None:
    """The cgroup's CPU quota in cores, or None (no limit, or not readable)."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def memory_total_bytes() -> int:
    """The node's RAM [Unit: byte]."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_available_bytes() -> int | None:
    """The node's ``MemAvailable`` (what new allocations can take without swapping)
    [Unit: byte]; None where ``/proc/meminfo`` has none."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def cache_dir() -> str:
    """``$UNSTALL_CACHE_DIR`` or ``~/.cache/unstall``: disk tiers, listings, indexes, copies."""
    return os.path.expanduser(_env("UNSTALL_CACHE_DIR") or DEFAULT_CACHE_DIR)


def shm_dir() -> str:
    """``$UNSTALL_SHM_DIR`` or ``/dev/shm``: where cache segments and slot files live."""
    return os.environ.get("UNSTALL_SHM_DIR", DEFAULT_SHM_DIR)


def shm_namespace() -> str:
    """``$UNSTALL_SHM_NAMESPACE``: a word in every segment name, keeping jobs apart ("": none)."""
    return _env("UNSTALL_SHM_NAMESPACE")


def free_bytes(directory: str | None = None) -> int:
    """Bytes an unprivileged user can still allocate in ``directory`` (default `shm_dir`)."""
    st = os.statvfs(shm_dir() if directory is None else directory)
    return st.f_bavail * st.f_frsize


# The cache ---------------------------------------------------------------------------------
def cache_keep_text() -> str:
    """``$UNSTALL_CACHE_KEEP_S`` as written ("": unset): seconds a RAM segment is kept."""
    return _env("UNSTALL_CACHE_KEEP_S")


def cache_keep_max_text() -> str:
    """``$UNSTALL_CACHE_KEEP_MAX`` as written ("": unset): the most kept segments may hold."""
    return _env("UNSTALL_CACHE_KEEP_MAX")


# Storage -----------------------------------------------------------------------------------
def s3_max_inflight() -> int | None:
    """``$UNSTALL_S3_MAX_INFLIGHT``: requests in flight per S3 store (None: the default)."""
    value = _number("UNSTALL_S3_MAX_INFLIGHT", int)
    return None if value is None else int(value)


def s3_retries() -> int:
    """``$UNSTALL_S3_RETRIES``: retries of a failed S3 request (default 6)."""
    return int(_number("UNSTALL_S3_RETRIES", int, 6) or 0)


def s3_timeout() -> float:
    """``$UNSTALL_S3_TIMEOUT``: seconds per S3 request attempt (default 30)."""
    return float(_number("UNSTALL_S3_TIMEOUT", float, 30.0) or 0.0)


# Coordination and peers --------------------------------------------------------------------
class CoordDefaults(NamedTuple):
    """``$UNSTALL_COORD_*``: a coordination group's window and time-outs [Unit: second]."""

    window: int
    detach_s: float
    claim_timeout_s: float
    wait_timeout_s: float


def coord_defaults() -> CoordDefaults:
    """The coordination defaults: ``$UNSTALL_COORD_WINDOW`` (16), ``..._DETACH_S`` (2),
    ``..._CLAIM_TIMEOUT_S`` (10), ``..._WAIT_TIMEOUT_S`` (30)."""
    return CoordDefaults(
        int(_number("UNSTALL_COORD_WINDOW", int, 16) or 0),
        float(_number("UNSTALL_COORD_DETACH_S", float, 2.0) or 0.0),
        float(_number("UNSTALL_COORD_CLAIM_TIMEOUT_S", float, 10.0) or 0.0),
        float(_number("UNSTALL_COORD_WAIT_TIMEOUT_S", float, 30.0) or 0.0),
    )


def peer_port() -> int:
    """``$UNSTALL_PEER_PORT``: the port this node's peer server listens on (0: any free)."""
    return int(_number("UNSTALL_PEER_PORT", int, 0) or 0)


def peer_store_port(default: int) -> int:
    """``$UNSTALL_PEER_STORE_PORT``: the port of the peers' key-value store, else ``default``."""
    return int(_number("UNSTALL_PEER_STORE_PORT", int, default) or 0)


def peer_addr() -> str:
    """``$UNSTALL_PEER_ADDR``: the address other nodes reach this one at ("": found)."""
    return _env("UNSTALL_PEER_ADDR")


def peer_token() -> str:
    """``$UNSTALL_PEER_TOKEN``: the job's shared secret for peers ("": made by rank 0)."""
    return _env("UNSTALL_PEER_TOKEN")


# The loader and its tuner ------------------------------------------------------------------
def prep_engine() -> str | None:
    """``$UNSTALL_PREP_ENGINE`` (`PREP_ENGINE_ENV`), lower case: the GPU engine forced."""
    return _env(PREP_ENGINE_ENV).strip().lower() or None


def dali_feed() -> str:
    """``$UNSTALL_DALI_FEED`` (`DALI_FEED_ENV`), lower case ("": the default)."""
    return _env(DALI_FEED_ENV).strip().lower()


def timeline() -> bool:
    """``$UNSTALL_TIMELINE`` set (by `unstall analyze`): keep per-batch spans."""
    return bool(_env("UNSTALL_TIMELINE"))


#: The loader watchdog's bound for every loader without ``watchdog_s=`` [s].
WATCHDOG_ENV = "UNSTALL_WATCHDOG_S"


def watchdog_text() -> str:
    """``$UNSTALL_WATCHDOG_S`` (`WATCHDOG_ENV`; "": not set): the loader watchdog's bound for
    every loader without ``watchdog_s=`` (`unstall.loader.watchdog`)."""
    return _env(WATCHDOG_ENV)


def config_path() -> str:
    """``$UNSTALL_CONFIG`` (set by ``unstall run --config FILE``; "": none)."""
    return _env("UNSTALL_CONFIG")


def autotune_job() -> str:
    """``$UNSTALL_AUTOTUNE_JOB``: the job whose ranks share the node's cores ("": found)."""
    return _env("UNSTALL_AUTOTUNE_JOB")


# The job's processes: torchrun and Ray ---------------------------------------------------
#: torchrun's variables that place a process in its job (`torchrun_place`), with defaults.
TORCHRUN_PLACE = dict.fromkeys(("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
TORCHRUN_PLACE |= {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def rank_if_any(known: int | None = None) -> int | None:
    """This process's rank, one precedence: torch.distributed's while a group is up
    (frameworks start ranks their own way), else ``known`` (recorded while one was up),
    else ``$RANK``, else ``$LOCAL_RANK``, else None (not a distributed job)."""
    dist = sys.modules.get("torch.distributed")  # never imported here: cheap, torch-free
    with contextlib.suppress(Exception):  # a group being torn down
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    return next((v for v in (known, _int_env("RANK"), local_rank()) if v is not None), None)


def rank() -> int:
    """This process's rank (`rank_if_any`), 0 outside a distributed job."""
    return rank_if_any() or 0


def local_rank() -> int | None:
    """torchrun's ``$LOCAL_RANK``: this process's rank on its node (None: not set)."""
    return _int_env("LOCAL_RANK")


def local_world_size() -> int:
    """torchrun's ``$LOCAL_WORLD_SIZE``: the job's processes on this node (1: not set)."""
    return max(1, _int_env("LOCAL_WORLD_SIZE") or 1)


def torchrun_job() -> str:
    """The job's name from ``$MASTER_ADDR``, ``$MASTER_PORT``, ``$TORCHELASTIC_RUN_ID`` ("":
    not under torchrun): a node's ranks of one job share its cores under it."""
    parts = [_env(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")]
    return "|".join(parts) if any(parts) else ""


def torchrun_place(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`TORCHRUN_PLACE`'s variables in this process (or ``environ``); a RuntimeError names
    one not set."""
    env = os.environ if environ is None else environ
    out = {name: env.get(name, default) for name, default in TORCHRUN_PLACE.items()}
    for name, value in out.items():
        if value is None:
            raise RuntimeError(
                f"this needs torchrun's environment: ${name} is not set (start the job with "
                f"torchrun, or set {', '.join(TORCHRUN_PLACE)})"
            )
    return out


def ray_address() -> str | None:
    """``$RAY_ADDRESS``: the Ray cluster this environment names (None: none)."""
    return _env("RAY_ADDRESS") or None


# `unstall run` and `unstall analyze` -------------------------------------------------------
def run_dir() -> str:
    """``$UNSTALL_RUN_DIR``: where an ``unstall run``'s processes write their reports."""
    return _env("UNSTALL_RUN_DIR")


def run_root() -> int | None:
    """``$UNSTALL_RUN_ROOT``: the pid of the run's root process (None: unset or not a number)."""
    return _int_env("UNSTALL_RUN_ROOT")


def run_json() -> str:
    """``$UNSTALL_RUN_JSON``: where the run's JSON summary goes ("": none)."""
    return _env("UNSTALL_RUN_JSON")


class AnalyzeEnv(NamedTuple):
    """``$UNSTALL_ANALYZE_*``: what the analyzer's agent in a script's process measures."""

    mode: str
    out: str
    warmup: int
    steps: int
    min_s: float
    max_s: float
    then: str  # the mode measured next in the same process, once ``mode``'s window is written


def analyze_env() -> AnalyzeEnv:
    """The agent's settings (mode "" when not under `unstall analyze`)."""
    return AnalyzeEnv(
        mode=_env("UNSTALL_ANALYZE_MODE"),
        out=_env("UNSTALL_ANALYZE_OUT"),
        warmup=int(_env("UNSTALL_ANALYZE_WARMUP") or "10"),
        steps=int(_env("UNSTALL_ANALYZE_STEPS") or "50"),
        min_s=float(_env("UNSTALL_ANALYZE_MIN_S") or "20"),
        max_s=float(_env("UNSTALL_ANALYZE_MAX_S") or "300"),
        then=_env("UNSTALL_ANALYZE_THEN"),
    )


def bench_dir() -> str:
    """``$UNSTALL_BENCH_DIR``: a disk path for benchmark files ("": the cache directory)."""
    return _env("UNSTALL_BENCH_DIR")


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back what was there (a
    benchmark's fresh cache directory, the analyzer's timeline). Written out: importing
    ``unittest.mock`` here cost every process that reads a fact 0.17 s (it loads asyncio)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
