"""A coordinated loader run as its own process (one job of a sweep), for the tests.

argv: group, out file, epochs, barrier dir, members; env MEMBER_* tune it (MEMBER_CATCH_UP:
other members' progress files; it skips its training steps while it is behind them all). Writes the
batches it saw (ids and augmented tensors) and its coordination stats to the out file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

import unstall


class Counted(torch.utils.data.Dataset):
    """Sample i: (i, random augmentation); every prepare call is logged to ``log``."""

    def __init__(self, n: int, log: str):
        self.n, self.log = n, log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        kill_at = os.environ.get("MEMBER_KILL_WORKER_AT")
        if kill_at and i == int(kill_at) and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies holding its claim
        time.sleep(float(os.environ.get("MEMBER_PREP_S", "0.002")))
        return torch.tensor([i]), torch.rand(3) + torch.randint(0, 100, (1,))


def solo(n: int, epochs: int, **kw):
    """What one uncoordinated loader sees: list of (ids, aug) per batch, all epochs."""
    loader = unstall.DataLoader(Counted(n, os.devnull), batch_size=4, shuffle=True, seed=5, **kw)
    return [(x.clone(), y.clone()) for _ in range(epochs) for x, y in loader]


def _ahead_of_me(progress_files: list[str]) -> int:
    """The least progress among other members (given by their progress files); 0 if none."""
    seen = []
    for path in progress_files:
        try:
            with open(path) as f:
                seen.append(int(f.read() or 0))
        except (FileNotFoundError, ValueError):
            seen.append(0)
    return min(seen, default=0)


def main() -> None:
    group, out, epochs, barrier, members = sys.argv[1:6]
    n = int(os.environ.get("MEMBER_N", "48"))
    loader = unstall.DataLoader(
        Counted(n, out + ".log"),
        batch_size=4,
        shuffle=True,
        seed=int(os.environ.get("MEMBER_SEED", "5")),
        num_workers=2,
        coordinate=group,
    )
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 30
    while len(os.listdir(barrier)) < int(members) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(float(os.environ.get("MEMBER_START_DELAY_S", "0")))
    seen, kill_after = [], int(os.environ.get("MEMBER_SUICIDE_AFTER", "-1"))
    step = float(os.environ.get("MEMBER_STEP_S", "0.01"))
    catch_up = [p for p in os.environ.get("MEMBER_CATCH_UP", "").split(os.pathsep) if p]
    progress = out + ".progress"
    try:
        for _ in range(int(epochs)):
            for x, y in loader:
                seen.append((x.clone(), y.clone()))
                with open(progress, "w") as f:
                    f.write(str(len(seen)))
                if len(seen) == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0 if len(seen) < _ahead_of_me(catch_up) else step)  # training step
        status = "ok"
    except Exception as exc:  # e.g. its own worker was killed: the others must not care
        status = f"{type(exc).__name__}: {exc}"
        time.sleep(float(os.environ.get("MEMBER_LINGER_S", "0")))  # stay a member a while
    torch.save({"seen": seen, "stats": loader.stats()["coordination"], "status": status}, out)
    loader.close()
    print(json.dumps({"status": status}))


if __name__ == "__main__":
    main()
