"""Where a map-style loader stands: the epoch, its start, a loaded epoch's draws; resume.

One `EpochPosition` per loader owns every part of its position: the epoch the next
``iter()`` runs and the batch it starts from, whether `set_epoch` named it, the running
epoch's `Cursor` (batches handed out), and, with torch's order, what a loaded state says
the epoch drew. `state_dict` / `load_state_dict` turn it into JSON-safe values and back.

With unstall's order (``seed=``, shards) the order of an epoch is ``(seed, epoch)``.
With torch's order the state also records what the running epoch drew from torch's
RNG (`torch_order`): a resumed loader replays that draw, and draws nothing its first
run had already drawn before the checkpoint (the epoch's order, the workers' base
seed), so a script that restores torch's RNG state with the loader's continues with
the same samples and the same random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATE_VERSION = 1
#: What a state names besides the position: it must match the loader it is loaded into.
IDENTITY = ("seed", "num_samples", "batch_size", "world_size", "rank")
_SAVED = ("seed", "num_samples", "batch_size", "rank", "world_size")  # a state's key order


def identity(loader: Any) -> dict[str, Any]:
    """What a saved state must share with ``loader`` (`IDENTITY`), from its public attributes."""
    return {
        "seed": loader.seed,
        "num_samples": len(loader.dataset),
        "batch_size": loader.batch_size,
        "rank": loader.rank,
        "world_size": loader.world_size,
    }


@dataclass
class Cursor:
    """One ``iter()``'s epoch and the batches it has handed out (its start included)."""

    epoch: int
    handed: int


@dataclass(frozen=True)
class EpochStart:
    """What `EpochPosition.begin` gives the iteration it starts.

    ``loaded``: a resumed torch-order epoch's draws (``draw``, ``base_seed``,
    ``tail_done``), or None; ``forward_epoch``: `set_epoch` named this epoch (a user
    sampler is told); ``draw_tail``: the state's previous epoch still owes its tail draw.
    """

    cursor: Cursor
    loaded: dict[str, Any] | None
    forward_epoch: bool
    draw_tail: bool


class EpochPosition:
    """A loader's position: the next ``iter()``'s epoch and start, and the running epoch."""

    def __init__(self) -> None:
        self.epoch = 0  # the epoch the next iter() runs
        self.start = 0  # the batch it starts from
        self.epoch_set = False  # named by set_epoch (forwarded to a user sampler)
        self.running: Cursor | None = None  # the last iter()'s epoch and batches handed out
        self.loaded: dict[str, Any] | None = None  # a loaded torch-order epoch's draws
        self.base_seed: int | None = None  # the running iterator's worker base seed
        self.tail_pending = False  # a loaded state's previous epoch still owes its tail draw

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run ``epoch`` (a loaded position in it is kept)."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        if epoch != self.epoch:
            self.start = 0
            self.loaded = None
        self.epoch = epoch
        self.epoch_set = True

    @property
    def current_epoch(self) -> int:
        """The running epoch, or the next one before any ``iter()`` since a load."""
        return self.running.epoch if self.running is not None else self.epoch

    def begin(self) -> EpochStart:
        """Start the next epoch: its cursor, and what a loaded state left for it."""
        epoch, start = self.epoch, self.start
        self.epoch, self.start = epoch + 1, 0
        loaded, self.loaded = self.loaded, None
        draw_tail, self.tail_pending = self.tail_pending, False
        forward, self.epoch_set = self.epoch_set, False
        self.running = Cursor(epoch, start)
        return EpochStart(self.running, loaded, forward, draw_tail)

    def state_dict(
        self,
        identity: dict[str, Any],
        *,
        length: int,
        sampler: Any,
        torch_rule: bool,
        workers_kept: bool,
    ) -> dict[str, Any]:
        """Where the next batch would come from, with ``identity`` (`IDENTITY`'s values).

        ``length``: batches per epoch; ``sampler``: the batch sampler (with torch's order,
        its ``draw`` and ``tail``); ``workers_kept``: the next ``iter()`` reuses persistent
        workers (torch draws no base seed then).
        """
        state: dict[str, Any] = {"version": STATE_VERSION}
        # What the next iter() must not draw again (torch's order only): None, or the
        # running epoch's draw, its workers' base seed and whether its tail was drawn.
        drawn: dict[str, Any] | None = None
        tail_pending = self.tail_pending
        if self.running is None:
            epoch, done = self.epoch, self.start
            if self.loaded is not None and self.loaded["epoch"] == epoch:  # loaded, not run
                drawn = self.loaded
        else:
            epoch, done = self.running.epoch, self.running.handed
            draw, tail = getattr(sampler, "draw", None), getattr(sampler, "tail", None)
            if done >= length:
                epoch, done = epoch + 1, 0
                tail_pending = tail == "pending"  # cut before the pull that ends the epoch
                if torch_rule and workers_kept:  # persistent workers: seeded already
                    drawn = {"draw": None, "tail_done": False}
            else:
                drawn = {
                    "draw": draw[1] if draw is not None and draw[0] == epoch else None,
                    "tail_done": tail == "done",
                }
            if drawn is not None:
                drawn["base_seed"] = self.base_seed
        state.update(epoch=epoch, batches_done=done)
        state.update((k, identity[k]) for k in _SAVED)
        if torch_rule:
            state["order"] = "torch"
            state["base_drawn"] = drawn is not None
            state["draw"] = drawn["draw"] if drawn else None
            state["base_seed"] = drawn["base_seed"] if drawn else None
            state["tail_done"] = bool(drawn and drawn["tail_done"])
            state["tail_pending"] = bool(tail_pending)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (checked by `check_state`) at the next ``iter()``."""
        torch_state = state.get("order") == "torch"
        self.epoch = int(state["epoch"])
        self.start = int(state["batches_done"])
        self.running = None
        self.loaded = None
        self.tail_pending = bool(torch_state and state.get("tail_pending"))
        if torch_state and state.get("base_drawn"):
            self.loaded = {
                "epoch": self.epoch,
                "draw": state.get("draw"),
                "base_seed": state.get("base_seed"),
                "tail_done": bool(state.get("tail_done")),
            }


def check_state(
    state: dict[str, Any], identity: dict[str, Any], *, torch_rule: bool, seed_given: bool
) -> int | None:
    """Check that ``state`` fits a loader with ``identity``; the saved seed it must adopt.

    A loader made without ``seed`` takes a saved seed (and unstall's order with it):
    the seed is returned then, else None.
    """
    missing = {"epoch", "batches_done", "seed"} - set(state)
    if missing:
        raise ValueError(f"loader state lacks keys {sorted(missing)}; got {sorted(state)}")
    torch_state = state.get("order") == "torch"
    if torch_state and not torch_rule:
        raise ValueError(
            f"loader state follows torch's order (saved by a loader without seed=) but this "
            f"loader has seed={identity['seed']!r}; resume with the same seed, batch size and "
            "shards"
        )
    adopt = None
    if not torch_state and not seed_given and state["seed"] != identity["seed"]:
        adopt = int(state["seed"])
        identity = {**identity, "seed": adopt}
    for key in IDENTITY:
        if key in state and state[key] != identity[key]:
            raise ValueError(
                f"loader state has {key}={state[key]!r} but this loader has "
                f"{key}={identity[key]!r}; resume with the same dataset, seed, batch size and "
                "world size"
            )
    return adopt
