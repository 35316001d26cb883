"""``num_workers="auto"`` / ``prefetch_factor="auto"``: the loader tunes its pool while it runs.

`rule` decides from one window's measurements, `policy` walks from window to window
(judging each change, undoing one that did not pay; pure, so ``unstall analyze`` walks it
too), `resources` measures the cores and memory left, `share` splits a node's cores
between the ranks of one job, `pool` changes a running epoch's pool between two batches,
`controller` ties them to one loader.

Its own names are the torch-free ones (the rule and ``AUTO``): ``unstall analyze``'s process
walks `policy` without torch. The loader's side is in `controller` (`AutoTuner`,
`take_auto`), `pool` and `share`.
"""

from unstall.loader.autotune.policy import AUTO
from unstall.loader.autotune.rule import Budget, Decision, Window, decide

__all__ = ["AUTO", "Budget", "Decision", "Window", "decide"]
