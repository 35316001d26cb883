"""The detection plan, timed beside the job's own ``dataset[i]`` in the job's process.

A dataset that calls a torchvision ``transforms.v2`` detection pipeline with ``(image,
target)`` (`unstall.adapt.detection.find_detection`) is run by ``prep="lean"`` as a plan:
boxes first, each output pixel made once (`unstall.adapt.detection`). `detection_probe`
measures what that changes on the job's own samples: the CPU per sample of ``dataset[i]``
as it is and of the planned ``dataset[i]``, in pairs on the same indices with the same
draws (torch's generator seeded alike before each side), on this thread's CPU clock with
torch on one thread, as in a loader worker. The recommend stage prices the ``detection``
remedy from their ratio (`unstall.analysis.recommend.detection`); a pipeline the plan
leaves as it is comes back with why, and is not priced.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: Sample pairs timed (each index as it is, then planned): the SSD preset's 1024x768 images
#: take ~0.2 s a pair on one core. Its random canvas (1-16x the image's pixels) makes a
#: few samples' mean swing: on 500x375 JPEGs, 12 pairs gave 2.09-2.22x, 24 and 48 gave
#: 1.93-1.94x, 96 2.02x (the script's own end to end, planned against as is: 2.04x).
DETECTION_SAMPLES = 24


def detection_probe(dataset: Any, samples: int = DETECTION_SAMPLES) -> dict[str, Any] | None:
    """``{"own_cpu_s", "plan_cpu_s", "samples", "adapt", "plan"}`` for a detection dataset
    (CPU seconds per sample of ``dataset[i]`` as it is and planned), ``{"adapt": None,
    "refused": why}`` where the plan leaves its pipeline as it is, None where ``dataset``
    is not a detection one (or a sample fails: the probe is optional). The generators the
    script uses are left as they were.

    A process that never imported torchvision's ``transforms.v2`` holds no such pipeline:
    the probe then returns None without importing it (the plan's modules import torchvision,
    ~2 s of CPU a process, which a script without it would pay for nothing)."""
    if "torchvision.transforms.v2" not in sys.modules:
        return None
    import torch

    from unstall.adapt.detection import find_detection, planned_dataset
    from unstall.adapt.recognize import Refusal

    try:
        found = find_detection(dataset)
        count = len(dataset)
    except Exception:
        return None
    if found is None or count < 1:
        return None
    if isinstance(found, Refusal):
        return {"adapt": None, "refused": found.reason}
    planned = planned_dataset(dataset, found)
    step = max(1, count // samples)
    indices = list(range(0, count, step))[:samples]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker
    own = plan = 0.0
    try:
        with torch.random.fork_rng(devices=[]):
            for side in (dataset, planned):  # warm: imports, first-call set-up
                torch.manual_seed(0)
                side[indices[0]]
            for k, i in enumerate(indices):
                torch.manual_seed(k)
                c0 = time.thread_time()
                dataset[i]
                c1 = time.thread_time()
                torch.manual_seed(k)
                planned[i]
                c2 = time.thread_time()
                own, plan = own + c1 - c0, plan + c2 - c1
    except Exception:
        return None
    finally:
        torch.set_num_threads(threads)
    n = len(indices)
    if own <= 0:
        return None
    return {
        "own_cpu_s": own / n,
        "plan_cpu_s": plan / n,
        "samples": n,
        "adapt": found.name,
        "plan": repr(planned.plan),
    }
