"""What the rates stage hands on: the job's rates, where its time went, what is unknown.

The model stage (`unstall.analysis.model`) reads it; nothing here predicts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from unstall.analysis.measure.result import Measurement


@dataclass(frozen=True)
class Rates:
    """What the measurements say about this job [Unit: samples/s, second, byte].

    Attributes:
        ingestion: G, the model's own rate (synthetic run).
        prep_cpu_s: CPU seconds a worker spends preparing one sample.
        cores: cores the loader's workers can use on this machine.
        sample_bytes: mean bytes fetched per sample.
        bandwidth: storage throughput B, all readers together [byte/s].
        latency_s: storage time per request L.
        main_cpu_s: CPU seconds per sample of the loader's own work on the training loop's
            thread: one thread, so it caps the rate at ``1 / main_cpu_s``. As the job ran it is
            the receive (both derive paths set the two alike: the same seconds
            priced twice over, as a serial cap here and as cores in `receive_cpu_s`); they
            part where the thread's work changes (a remote pool's wire decode adds to this
            cap, and the process's cores are then priced in one term: `recommend.remote`).
        cache_read_s: seconds to read one sample from the cache.
        proc_cpu_s: CPU seconds per sample of the training process besides the receive (the
            loop, the model's host work, pin-memory thread): it takes cores from the workers.
        receive_cpu_s: CPU seconds per sample the training process spends taking its batches
            from the workers (the loop's thread in the loader's ``__next__``: the result
            queue, unpickling, the tensors rebuilt from shared memory, the hand-off's slot),
            timed in the real run as it is. The one measure of it: every configuration with
            workers pays it, whatever else changes, so `process_cpu_s` adds it; a run that
            hands out one batch again (the synthetic one) never pays it. Workers and process
            together cap the rate at ``cores / (prep_cpu_s + process_cpu_s)``.
        loop_runq_s: seconds per sample the training loop's thread waited for a core in the
            measured run (``/proc/thread-self/schedstat``): the workers' CPU beside it on the
            same cores (on one core, 2-3 ms a step: 10-15 % of a 20 ms step).
        loop_runq_load: cores the workers kept busy then (their CPU per sample times the
            measured rate): the loop's wait is priced in proportion to it (`predict`).
        batch_cv: coefficient of variation of a worker's time per batch, where measured (0:
            steady batches): torch's in-order delivery idles the workers by it
            (`unstall.analysis.model.predict.in_order_share`).
    """

    ingestion: float
    prep_cpu_s: float
    cores: float
    sample_bytes: float
    bandwidth: float
    latency_s: float
    main_cpu_s: float = 0.0
    cache_read_s: float = 0.0
    proc_cpu_s: float = 0.0
    loop_runq_s: float = 0.0
    loop_runq_load: float = 0.0
    receive_cpu_s: float = 0.0
    batch_cv: float = 0.0

    @property
    def process_cpu_s(self) -> float:
        """CPU seconds per sample of the whole training process: its own and the receive."""
        return self.proc_cpu_s + self.receive_cpu_s

    def batch_fetch_s(
        self,
        batch_size: int,
        inflight: int,
        hit: float = 0.0,
        *,
        bandwidth: float | None = None,
        latency_s: float | None = None,
    ) -> float:
        """One worker's time to fetch a batch: misses go to storage in rounds of ``inflight``
        (``bandwidth``, ``latency_s``: storage other than measured)."""
        misses = (1.0 - hit) * batch_size
        bandwidth = bandwidth or self.bandwidth
        latency = self.latency_s if latency_s is None else latency_s
        rounds = math.ceil(misses / max(inflight, 1) - 1e-9) if misses > 1e-9 else 0
        return (
            rounds * latency
            + misses * self.sample_bytes / bandwidth
            + batch_size * self.cache_read_s
        )

    def as_dict(self) -> dict[str, float]:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}


#: The fewest cores a job is priced with where other jobs hold the rest: what the machine
#: measured left to it (its own CPU at least, on a full machine) down to this, never zero.
#: At 0.5 a job left a third of a core by other jobs was priced 45 % over its verification.
LEAST_CORES = 0.1

#: How ``Derived.unknown["fetch"]`` begins where F was not measured because the workers hardly
#: waited on I/O: storage then cannot be what limits the job (`Derived.io_unseen`).
NO_IO_WAIT = "no I/O wait seen"


@dataclass
class Derived:
    """The rates of one measured job, its stall shares and what the stalls show.

    Attributes:
        measurement: the measure stage's result this was derived from.
        rates: the figures the model prices configurations with.
        stall: compute, prep stall and fetch stall as shares of the cold run's time.
        measured: samples/s of the job as it is.
        fetch_rate: F, samples/s storage delivered (None: not measured, or no limit seen).
        bottleneck: what the stalls show; None when they are alike, for the model stage to
            settle by the slower of P and F.
        unknown: rates that were not measured, with the reason: never guessed or infinite.
        shared: other processes kept cores busy while the job was measured.
        notes: how it was measured and derived, for the report (the measurement's first).
        prep_rate_per_worker: samples/s one worker prepares by its CPU time (None: unknown).
        extra: more for the report (a script's oversubscription, G alone).
    """

    measurement: Measurement
    rates: Rates
    stall: dict[str, float]
    measured: float
    fetch_rate: float | None
    bottleneck: str | None
    unknown: dict[str, str] = field(default_factory=dict)
    shared: bool = False
    notes: list[str] = field(default_factory=list)
    prep_rate_per_worker: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def io_unseen(self) -> bool:
        """F was not measured because the workers hardly waited on I/O: fetch cannot limit."""
        return self.unknown.get("fetch", "").startswith(NO_IO_WAIT)
