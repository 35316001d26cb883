"""torch's own shuffling, drawn exactly as torch draws it, and recorded so resume can replay it.

A loader given no unstall-only option that changes the order (``seed``, ``rank``,
``world_size``, ``coordinate``) shuffles as torch's `RandomSampler`: at the epoch's first
index it draws a seed from torch's global generator, or, given the loader's
``generator``, permutes with that generator as it stands; ``torch.randperm`` then gives
the epoch's order. When the epoch runs out, `RandomSampler` calls ``randperm`` once more
(its ``[: num_samples % n]`` tail), which advances a user's generator: that call is
made too. The draw is kept as a JSON-safe dict, so the permutation stays a pure
function of a saved state: ``{"seed": s}`` or ``{"generator_state": base64}``.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import numpy as np
import torch


def draw_order(generator: torch.Generator | None) -> dict[str, Any]:
    """What torch's `RandomSampler` takes at an epoch's first index: a seed from the global
    generator (one draw, as torch), or the state of ``generator`` before its ``randperm``."""
    if generator is None:
        return {"seed": int(torch.empty((), dtype=torch.int64).random_().item())}
    state = generator.get_state().numpy().tobytes()
    return {"generator_state": base64.b64encode(state).decode("ascii")}


def permutation(n: int, draw: dict[str, Any], live: torch.Generator | None = None) -> np.ndarray:
    """The permutation of ``range(n)`` torch's `RandomSampler` yields for ``draw``.

    ``live``: the user's generator whose state ``draw`` recorded just now; it is advanced
    by the ``randperm``, as torch advances it. Without it (a resumed epoch) a private
    generator replays the recorded state and the user's generator is left alone.
    """
    if "seed" in draw:
        gen = torch.Generator()
        gen.manual_seed(int(draw["seed"]))
    elif live is not None:
        gen = live
    else:
        gen = _replay(draw)
    return torch.randperm(n, generator=gen).numpy()


def trailing_draw(n: int, generator: torch.Generator | None) -> None:
    """`RandomSampler`'s last ``randperm`` (its empty tail), made when the epoch runs out.

    Only a user's generator can tell it happened; the global generator is never used by it.
    """
    if generator is not None:
        torch.randperm(n, generator=generator)


def draw_key(draw: dict[str, Any]) -> int:
    """A 63-bit integer naming ``draw``: the seed part of the batches' keys (which seed
    unstall's own pipelines per batch; plain datasets keep torch's per-worker seeding)."""
    if "seed" in draw:
        return int(draw["seed"]) % 2**63
    digest = hashlib.sha256(draw["generator_state"].encode("ascii")).digest()
    return int.from_bytes(digest[:8], "little") % 2**63


def unshuffled_key(generator: torch.Generator | None) -> int:
    """The key seed of an unshuffled epoch: the seed behind the generator torch would use."""
    return int((generator or torch.default_generator).initial_seed()) % 2**63


def _replay(draw: dict[str, Any]) -> torch.Generator:
    gen = torch.Generator()
    try:
        raw = base64.b64decode(draw["generator_state"], validate=True)
        gen.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    except (KeyError, ValueError, RuntimeError) as exc:
        raise ValueError(
            f"loader state has a torch-order draw that cannot be replayed ({exc}); "
            "resume with the state_dict() of a loader built the same way"
        ) from exc
    return gen
