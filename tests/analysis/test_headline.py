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
