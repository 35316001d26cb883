"""The report's one-sentence headline: figures as a reader says them (no unrounded share of
cores: "644 samples/s from 2 workers on 0.696204 cores" was the docs' home page)."""

from __future__ import annotations

import pytest

from tests.analysis.conftest import derived_of
from unstall.analysis.report.build import cores, sentence


@pytest.mark.parametrize(
    ("n", "said"), [(0.696204, "0.7"), (2.0, "2"), (2, "2"), (15.54, "15.5"), (0.04, "0")]
)
def test_cores_are_said_to_one_decimal(n, said):
    assert cores(n) == said


def test_a_prep_bound_headline_rounds_the_share_of_cores():
    from unstall.analysis.model.stage import model_of
    from unstall.analysis.rates.result import Rates

    d = derived_of(
        2,
        Rates(4317.0, 0.00108, 0.696204, 1.0, 1e12, 0.0),
        stall={"compute": 0.16, "prep": 0.84, "fetch": 0.0},
        measured=712.0,
        unknown={},
    )
    text = sentence(model_of(d))
    assert text.startswith("Prep-bound: the model waits 84% of the time"), text
    assert " from 2 workers on 0.7 cores; 712/s delivered, 4,317/s needed)." in text, text


@pytest.mark.parametrize(("alone", "slowed"), [(5852.0, True), (2900.0, False), (0.0, False)])
def test_a_compute_bound_headline_says_when_the_workers_slow_the_model(alone, slowed):
    """The H200's ImageNet-shaped run: the model at 2,815/s beside 16 workers on 16 cores,
    5,852/s alone. Faster loading would not help, but fewer workers could: said so."""
    from dataclasses import replace

    from unstall.analysis.model.stage import model_of
    from unstall.analysis.rates.result import Rates

    d = derived_of(
        16,
        Rates(2815.0, 0.0059, 16.0, 1.0, 1e12, 0.0),
        stall={"compute": 0.91, "prep": 0.09, "fetch": 0.0},
        measured=2570.0,
        unknown={},
    )
    d = replace(d, bottleneck="compute", extra={"ingestion_rate_alone": alone})
    text = sentence(model_of(d))
    assert text.startswith("Compute-bound: the model is busy 91% of the time (2,570 of its 2,815")
    if slowed:
        assert "; 5,852/s alone): the workers (or other jobs) take CPU from the model's" in text
        assert text.endswith("fewer workers or less work per sample could speed this job up.")
    else:
        assert text.endswith("samples/s); faster data loading would not speed this job up.")
