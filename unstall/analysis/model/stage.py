"""The model stage: the rates stage's result priced by the model.

It reads `Derived` only and returns `Analysis`: the measured configuration, the prep
capacity P, the bottleneck (stalls alike are settled by the slower of P and F), the
model's check against the measured rate, the what-if table and curves, and the answer
to one ``--what-if`` question (`ask`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from unstall.analysis.measure.probe import StorageProbe
from unstall.analysis.measure.result import Measurement, Run
from unstall.analysis.model.predict import Config, predict, prep_capacity
from unstall.analysis.model.whatif import curves, grid, parse_what_if, row
from unstall.analysis.rates.result import Derived, Rates


@dataclass
class Analysis:
    """A measured job as the model sees it.

    Attributes:
        derived: the rates stage's result (which holds the measurement).
        base_config: the loader as it ran, as a model configuration.
        prep_rate: P, samples/s the workers can prepare on their cores (None: unknown).
        bottleneck: ``compute``, ``prep`` or ``fetch``.
        model_check: the model's prediction for the measured configuration beside it.
        what_if: the table over workers and cache sizes (empty when P is unknown).
        curves: throughput against cache size, workers and bandwidth.
        question: the row of the ``--what-if`` question, when one was asked.
    """

    derived: Derived
    base_config: Config
    prep_rate: float | None
    bottleneck: str
    model_check: dict[str, Any]
    what_if: list[dict[str, Any]] = field(default_factory=list)
    curves: dict[str, Any] = field(default_factory=dict)
    question: dict[str, Any] | None = None

    # the earlier stages' figures, read through -------------------------------------
    @property
    def measurement(self) -> Measurement:
        return self.derived.measurement

    @property
    def runs(self) -> dict[str, Run]:
        return self.derived.measurement.runs

    @property
    def probe(self) -> StorageProbe | None:
        return self.derived.measurement.probe

    @property
    def cached_hit_rate(self) -> float | None:
        return self.derived.measurement.cached_hit_rate

    @property
    def rates(self) -> Rates:
        return self.derived.rates

    @property
    def stall(self) -> dict[str, float]:
        return self.derived.stall

    @property
    def fetch_rate(self) -> float:
        """F in samples/s (0.0 when not measured)."""
        return self.derived.fetch_rate if self.derived.fetch_rate is not None else 0.0

    @property
    def prep_rate_per_worker(self) -> float | None:
        return self.derived.prep_rate_per_worker


def model_of(d: Derived) -> Analysis:
    """Price the measured job: P (never under what the workers delivered: `floored`), the
    bottleneck, the model's check, the what-if table."""
    d = floored(d)
    m = d.measurement
    base = Config.of_job(m)
    prep = None if "prep" in d.unknown else prep_capacity(d.rates, base)
    bottleneck = d.bottleneck
    if bottleneck is None:  # the stalls alike: the slower of the measured rates
        fetch = d.fetch_rate if d.fetch_rate is not None else math.inf
        bottleneck = "prep" if (prep if prep is not None else math.inf) <= fetch else "fetch"
    predicted = predict(d.rates, base).samples_per_s
    check = {
        "predicted_samples_per_s": round(predicted, 1),
        "measured_samples_per_s": round(d.measured, 1),
        "error": round(abs(predicted - d.measured) / d.measured, 4) if d.measured else None,
    }
    return Analysis(
        derived=d,
        base_config=base,
        prep_rate=prep,
        bottleneck=bottleneck,
        model_check=check,
        what_if=grid(d.rates, base, m.num_samples) if "prep" not in d.unknown else [],
        curves=curves(d.rates, base, m.num_samples, d.fetch_rate or d.measured),
    )


def ask(a: Analysis, what_if: str | None) -> Analysis:
    """``a`` with the answer to ``what_if`` (e.g. ``"cache=0.5,workers=8"``), if asked."""
    if not what_if:
        return a
    config = parse_what_if(what_if, a.base_config)
    n = a.measurement.num_samples
    return replace(a, question=row(a.rates, config, n, asked=what_if))


def floored(d: Derived) -> Derived:
    """``d`` with P no lower than the rate its workers delivered (`delivered_floor`), where
    their CPU per sample was measured; ``d`` itself where nothing changes."""
    if "prep" in d.unknown:
        return d
    notes = list(d.notes)
    rates = delivered_floor(d.rates, d.measurement, d.measured, notes)
    if rates is d.rates:
        return d
    per_worker = 1.0 / rates.prep_cpu_s if rates.prep_cpu_s > 0 else None
    return replace(d, rates=rates, notes=notes, prep_rate_per_worker=per_worker)


def delivered_floor(rates: Rates, m: Measurement, measured: float, notes: list[str]) -> Rates:
    """``rates`` whose P (the workers' capacity) is not under the rate they delivered.

    The workers' CPU per sample comes from thread clocks, which count more than the
    preparing (threads of a worker that wait spinning, a busy machine's accounting): where
    it prices P under what the workers measurably delivered, P would be a contradiction and
    every what-if row with it would under-predict, so the CPU per sample (with the training
    process's shares) is scaled to the delivered rate, and a note says so.
    """
    base = Config.of_job(m)
    if rates.prep_cpu_s <= 0 or measured <= 0:
        return rates
    p = prep_capacity(rates, base)
    if p >= measured:
        return rates
    k = p / measured
    notes.append(
        f"the workers delivered {measured:,.0f} samples/s, more than their timed CPU per "
        f"sample allows ({p:,.0f}/s): P is taken as at least the delivered rate"
    )
    fields = ("prep_cpu_s", "proc_cpu_s", "main_cpu_s", "receive_cpu_s", "loop_runq_load")
    scaled = {f: getattr(rates, f) * k for f in fields}
    return replace(rates, **scaled)
