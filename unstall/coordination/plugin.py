"""``coordinate=`` as a loader extension: the loader builds a `Coordination` through it.

The loader never imports this package: its extension registry (`unstall.loader.extensions`)
imports this module when a loader is given ``coordinate=``, and this module registers
the factory.
"""

from __future__ import annotations

from unstall.coordination.membership import Coordination
from unstall.loader import extensions

extensions.register("coordinate", Coordination)
