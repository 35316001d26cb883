"""``num_workers="auto"`` / ``prefetch_factor="auto"``: the loader tunes its pool while it runs.

`rule` decides from one window's measurements, `policy` walks from window to window
(judging each change, undoing one that did not pay; pure, so ``unstall analyze`` walks it
too), `resources` measures the cores and memory left, `share` splits a node's cores
between the ranks of one job, `pool` changes a running epoch's pool between two batches,
`controller` ties them to one loader.

Names load on first use: ``unstall analyze``'s own process walks `policy` without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

_HOMES = {
    "AUTO": "unstall.loader.autotune.policy",
    "AutoStart": "unstall.loader.autotune.controller",
    "AutoTuner": "unstall.loader.autotune.controller",
    "Budget": "unstall.loader.autotune.rule",
    "decide": "unstall.loader.autotune.rule",
    "Decision": "unstall.loader.autotune.rule",
    "NodeShare": "unstall.loader.autotune.share",
    "Others": "unstall.loader.autotune.share",
    "take_auto": "unstall.loader.autotune.controller",
    "TunedLoader": "unstall.loader.autotune.pool",
    "wants_auto": "unstall.loader.autotune.controller",
    "Window": "unstall.loader.autotune.rule",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
    from unstall.loader.autotune.controller import AutoStart, AutoTuner, take_auto, wants_auto
    from unstall.loader.autotune.policy import AUTO
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
