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
from unstall.analysis.measure.result import Measurement
from unstall.analysis.measure.runs import Run
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
    """Price the measured job: P, the bottleneck, the model's check, the what-if table."""
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
