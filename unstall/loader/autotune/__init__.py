"""``num_workers="auto"`` / ``prefetch_factor="auto"``: the loader tunes its pool while it runs.

`rule` decides from one window's measurements, `policy` walks from window to window
(judging each change, undoing one that did not pay; pure, so ``unstall analyze`` walks it
too), `resources` measures the cores and memory left, `share` splits a node's cores
between the ranks of one job, `pool` changes a running epoch's pool between two batches,
`controller` ties them to one loader.
"""

from unstall.loader.autotune.controller import AUTO, AutoStart, AutoTuner, take_auto, wants_auto
from unstall.loader.autotune.pool import TunedLoader
from unstall.loader.autotune.rule import Budget, Decision, Window, decide
from unstall.loader.autotune.share import NodeShare, Others

__all__ = [
    "AUTO",
    "AutoStart",
    "AutoTuner",
    "Budget",
    "Decision",
    "NodeShare",
    "Others",
    "TunedLoader",
    "Window",
    "decide",
    "take_auto",
    "wants_auto",
]
