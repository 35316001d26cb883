"""The loader's way in: ``prep="lean"`` (or another adapting value) on a detection dataset.

`adapt_detection` is called by `unstall.adapt.plugin` before the classification recognizer:
a dataset that calls a torchvision v2 pipeline with ``(image, target)`` is run as a
`PlannedDetection`, or left as it is with one line naming the op unstall does not plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unstall.adapt.detection.find import Found, find_detection
from unstall.adapt.recognize import Refusal


def adapt_detection(dataset: Any, prep: str, say: Callable[[str], None]) -> Any | None:
    """The dataset the loader runs for a detection ``dataset`` (planned, or ``dataset``
    itself after a line saying why not); None where ``dataset`` is not a detection one."""
    found = find_detection(dataset)
    if found is None:
        return None
    if isinstance(found, Refusal):
        say(f"unstall: prep={prep!r}: detection pipeline left as it is: {found.reason}")
        return dataset
    planned = planned_dataset(dataset, found)
    where = "" if prep == "lean" else " (on the CPU workers: detection is planned there)"
    plan = planned.plan
    say(f"unstall: prep={prep!r}: {found.name} detection pipeline planned ({plan!r}){where}")
    return planned


def planned_dataset(dataset: Any, found: Found) -> Any:
    """``dataset`` with the pipeline ``found`` in it run as a `DetectionPlan`: what
    ``prep="lean"`` hands the loader, and what the analyzer times beside ``dataset[i]``."""
    from unstall.adapt.detection.dataset import PlannedDetection
    from unstall.adapt.detection.plan import DetectionPlan

    plan = DetectionPlan(found.steps, name=found.name)
    return PlannedDetection(dataset, found.owner, found.attr, plan, found.name)
