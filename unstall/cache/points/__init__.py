"""Cache points: what a node cache holds of a sample besides its bytes.

- `samples`: the whole prepared sample (``Cache(hold="samples")``), for a deterministic
  preparation; `bind_points` is what a loader binds (`unstall.loader.cache_binding`).
- `decoded`, `placement`, `planning`: a recognized image folder's decoded images
  (``hold="decoded"``), and mixed placement over the RAM and disk tiers (``"auto"``);
- `determinism`: recognized ops' randomness, and the check on the job's own samples;
- `fingerprint`: the preparation's fingerprint that names the entries;
- `codec`: a sample as compact, exact bytes.
"""

from unstall.cache.points.binding import bind_points
from unstall.cache.points.determinism import Verdict

__all__ = ["Verdict", "bind_points"]
