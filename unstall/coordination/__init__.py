"""Coordinated preparation: K loaders on one node prepare each minibatch once and share it.

``unstall.DataLoader(..., coordinate="NAME")`` (or ``coordinate=True``: named from
the dataset's fingerprint) joins group NAME. A batch is prepared by whichever
member's worker claims it first and published in shared memory; the others map it
without copying. Nobody waits on a slow or dead member: see `group.py` (members,
window, detaching, cleanup), `claims.py` (claim, publish, map), `membership.py` (one
loader's part) and `plugin.py` (how ``coordinate=`` reaches the loader).
"""

from unstall.coordination.group import GroupMismatch, group_dir
from unstall.coordination.membership import Coordination, dataset_fingerprint

__all__ = ["Coordination", "GroupMismatch", "dataset_fingerprint", "group_dir"]
