"""A map-style loader's position as a JSON-safe dict, and taking one back.

With unstall's order (``seed=``, shards) the order of an epoch is ``(seed, epoch)``.
With torch's order the state also records what the running epoch drew from torch's
RNG (`torch_order`): a resumed loader replays that draw, and draws nothing its first
run had already drawn before the checkpoint (the epoch's order, the workers' base
seed), so a script that restores torch's RNG state with the loader's continues with
the same samples and the same random numbers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

STATE_VERSION = 1


def state_of(loader: Any) -> dict[str, Any]:
    """``loader.state_dict()``: where the next batch would come from."""
    started, draw = False, None
    if loader._position is None:
        epoch, done = loader._next_epoch, loader._pending_start
        resume = loader._resume
        if resume is not None and resume["epoch"] == epoch:  # loaded, not yet run
            started, draw = True, resume
    else:
        epoch, done = loader._position
        if done >= len(loader):
            epoch, done = epoch + 1, 0
        else:
            started = True
            drawn = getattr(loader._sampler, "draw", None)
            draw = {
                "draw": drawn[1] if drawn is not None and drawn[0] == epoch else None,
                "base_seed": loader._base_seed,
            }
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches_done": done,
        "seed": loader.seed,
        "num_samples": len(loader.dataset),
        "batch_size": loader.batch_size,
        "rank": loader.rank,
        "world_size": loader.world_size,
    }
    if _torch_rule(loader):
        state["order"] = "torch"
        state["started"] = started
        state["draw"] = draw["draw"] if draw else None
        state["base_seed"] = draw["base_seed"] if draw else None
    return state


def load(loader: Any, state: dict[str, Any]) -> None:
    """``loader.load_state_dict(state)``: the next ``iter()`` continues from there."""
    missing = {"epoch", "batches_done", "seed"} - set(state)
    if missing:
        raise ValueError(f"loader state lacks keys {sorted(missing)}; got {sorted(state)}")
    torch_state = state.get("order") == "torch"
    if torch_state and not _torch_rule(loader):
        raise ValueError(
            f"loader state follows torch's order (saved by a loader without seed=) but this "
            f"loader has seed={loader.seed!r}; resume with the same seed, batch size and shards"
        )
    if not torch_state and not loader._seed_given and state["seed"] != loader.seed:
        _adopt_seed(loader, int(state["seed"]))
    for key in ("seed", "num_samples", "batch_size", "world_size", "rank"):
        mine = len(loader.dataset) if key == "num_samples" else getattr(loader, key)
        if key in state and state[key] != mine:
            raise ValueError(
                f"loader state has {key}={state[key]!r} but this loader has {key}={mine!r}; "
                "resume with the same dataset, seed, batch size and world size"
            )
    loader._next_epoch = int(state["epoch"])
    loader._pending_start = int(state["batches_done"])
    loader._position = None
    loader._resume = None
    if torch_state and state.get("started"):
        loader._resume = {
            "epoch": loader._next_epoch,
            "draw": state.get("draw"),
            "base_seed": state.get("base_seed"),
        }


def _torch_rule(loader: Any) -> bool:
    return loader.order is not None and loader.order.rule == "torch"


def _adopt_seed(loader: Any, seed: int) -> None:
    """Take a saved run's ``seed`` (and so unstall's order) in place of torch's draws."""
    loader.seed = seed
    if loader.order is not None:
        loader.order = replace(loader.order, seed=seed, rule="seeded")
        loader._sampler.spec = loader.order
