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
    state: dict[str, Any] = {"version": STATE_VERSION}
    torch_rule = _torch_rule(loader)
    # What the next iter() must not draw again (torch's order only): None, or the
    # running epoch's draw, its workers' base seed and whether its tail was drawn.
    drawn: dict[str, Any] | None = None
    tail_pending = loader._tail_pending
    if loader._position is None:
        epoch, done = loader._next_epoch, loader._pending_start
        if loader._resume is not None and loader._resume["epoch"] == epoch:  # loaded, not run
            drawn = loader._resume
    else:
        epoch, done = loader._position
        sampler = loader._sampler
        draw, tail = getattr(sampler, "draw", None), getattr(sampler, "tail", None)
        if done >= len(loader):
            epoch, done = epoch + 1, 0
            tail_pending = tail == "pending"  # cut before the pull that ends the epoch
            if torch_rule and _workers_kept(loader):  # persistent workers: seeded already
                drawn = {"draw": None, "tail_done": False}
        else:
            drawn = {
                "draw": draw[1] if draw is not None and draw[0] == epoch else None,
                "tail_done": tail == "done",
            }
        if drawn is not None:
            drawn["base_seed"] = loader._base_seed
    state.update(
        epoch=epoch,
        batches_done=done,
        seed=loader.seed,
        num_samples=len(loader.dataset),
        batch_size=loader.batch_size,
        rank=loader.rank,
        world_size=loader.world_size,
    )
    if torch_rule:
        state["order"] = "torch"
        state["base_drawn"] = drawn is not None
        state["draw"] = drawn["draw"] if drawn else None
        state["base_seed"] = drawn["base_seed"] if drawn else None
        state["tail_done"] = bool(drawn and drawn["tail_done"])
        state["tail_pending"] = bool(tail_pending)
    return state


def _workers_kept(loader: Any) -> bool:
    """Whether the next ``iter()`` reuses persistent workers (torch draws no base seed then)."""
    return getattr(loader._inner, "_iterator", None) is not None


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
    loader._tail_pending = bool(torch_state and state.get("tail_pending"))
    if torch_state and state.get("base_drawn"):
        loader._resume = {
            "epoch": loader._next_epoch,
            "draw": state.get("draw"),
            "base_seed": state.get("base_seed"),
            "tail_done": bool(state.get("tail_done")),
        }


def _torch_rule(loader: Any) -> bool:
    return loader.order is not None and loader.order.rule == "torch"


def _adopt_seed(loader: Any, seed: int) -> None:
    """Take a saved run's ``seed`` (and so unstall's order) in place of torch's draws."""
    loader.seed = seed
    if loader.order is not None:
        loader.order = replace(loader.order, seed=seed, rule="seeded")
        loader._sampler.spec = loader.order
