"""Remote workers on a real Ray cluster (tests/remote/conftest.py): order, draws, exactly
once, resume, a lost actor and a lost node, SIGINT, a failing sample.

Each loader here waits for its actors (``wait_up_s``) so that remote batches are really
in each epoch; ``stats()["remote"]`` says how many were.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import unstall
from tests.remote.datasets import Noisy, NotOnTheNodes

#: The module's tests share one cluster (conftest.py) and run in order, on one xdist worker of
#: the timed tests (`--dist loadfile`: a file's tests go to one worker), on one core.
pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def run_epochs(loader, epochs: int = 1, *, stop_after: int | None = None, each=None):
    """Every batch of ``epochs`` epochs as ``(indices, x)`` pairs (cloned)."""
    out = []
    for _ in range(epochs):
        for n, batch in enumerate(loader):
            out.append((batch["index"].tolist(), batch["x"].clone()))
            if each is not None:
                each(n)
            if stop_after is not None and len(out) >= stop_after:
                return out
    return out


def reference(ds: Noisy, epochs: int = 1, num_workers: int = 0, **kw):
    """The batches of ``epochs`` epochs prepared here (by ``num_workers`` local workers), read
    without ``ds``'s per-sample sleep: a sample's content does not depend on it."""
    quick = Noisy(ds.n, bad=ds.bad)
    return run_epochs(unstall.DataLoader(quick, num_workers=num_workers, **kw), epochs)


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
    )


def remote(cluster, **kw) -> unstall.Remote:
    kw.setdefault("workers", 2)
    return unstall.Remote(address=cluster.address, wait_up_s=120, **kw)


def alive_actors() -> list[dict]:
    """The cluster's `BatchWorker` actors alive, restarting or being created (from the GCS's
    actor table: Ray's state API needs the dashboard, which this cluster does without)."""
    from ray._private.state import actors

    live = ("ALIVE", "RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY")
    rows = actors().values()
    return [r for r in rows if r["ActorClassName"] == "BatchWorker" and r["State"] in live]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def test_same_batches_as_local_workers_exactly_once_and_resume(cluster):
    """Bit-identical batches (indices and every random draw) to local workers for one seed,
    over 2 epochs, each sample once an epoch; a state saved mid-epoch resumes exactly."""
    ds = Noisy(64, sleep_s=0.002)
    kw = {"batch_size": 4, "shuffle": True, "seed": 11}
    want = reference(ds, 2, num_workers=2, **kw)
    loader = unstall.DataLoader(ds, num_workers=1, remote=remote(cluster), **kw)
    got = run_epochs(loader, 2)
    assert same(got, want)
    for epoch in (got[:16], got[16:]):
        assert sorted(i for idx, _ in epoch for i in idx) == list(range(64))
    s = loader.stats()["remote"]
    assert s["batches"] > 0 and s["batches"] + s["local_batches"] == 32, s
    assert sum(n["batches"] for n in s["nodes"].values()) == s["batches"]
    assert s["bytes"] == sum(n["bytes"] for n in s["nodes"].values()) > 0
    # resume: 5 batches into epoch 2, saved, then the rest from the saved state
    loader.set_epoch(1)
    run_epochs(loader, stop_after=5)
    state = loader.state_dict()
    loader.close()  # its actors hold the cluster's 2 CPUs
    # one actor is enough to show remote batches in a resumed epoch (each start imports torch)
    again = unstall.DataLoader(ds, num_workers=0, remote=remote(cluster, workers=1), **kw)
    again.load_state_dict(state)
    rest = run_epochs(again)
    assert same(rest, want[16 + 5 :])
    assert again.stats()["remote"]["batches"] > 0
    again.close()
    wait_for(lambda: not alive_actors(), 30, "the closed loaders' actors to go")


def test_a_failing_sample_is_named_and_the_epoch_goes_on(cluster):
    ds = Noisy(32, bad=13)
    r = remote(cluster, workers=1)  # every batch on it: the failing one too
    loader = unstall.DataLoader(ds, batch_size=4, seed=1, num_workers=0, remote=r)
    it = iter(loader)
    seen, errors = [], []
    while True:
        try:
            seen.extend(next(it)["index"].tolist())
        except StopIteration:
            break
        except ValueError as exc:
            errors.append(exc)
    assert len(errors) == 1
    text = str(errors[0]) + " ".join(getattr(errors[0], "__notes__", []))
    assert "sample 13 is corrupt" in text and "dataset index 13" in text, text
    assert "remote worker" in text, text
    assert seen == [i for i in range(32) if i // 4 != 13 // 4]
    loader.close()


def test_a_dataset_the_nodes_cannot_build_is_said_once_and_served_locally(cluster, caplog):
    loader = unstall.DataLoader(
        NotOnTheNodes(16), batch_size=4, seed=0, num_workers=1, remote=remote(cluster, workers=1)
    )

    def said() -> bool:
        loader.stats()  # takes the actors' answers in
        return any("cannot build the dataset" in r.getMessage() for r in caplog.records)

    wait_for(said, 60, "the warning")
    (message,) = [r.getMessage() for r in caplog.records if "cannot build" in r.getMessage()]
    assert "codec_only_here" in message
    assert [i for b in loader for i in b["index"].tolist()] == list(range(16))
    assert loader.stats()["remote"]["batches"] == 0
    loader.close()


def test_an_actor_killed_mid_epoch_resends_its_batches(cluster, caplog):
    ds = Noisy(96, sleep_s=0.02)
    kw = {"batch_size": 4, "shuffle": True, "seed": 4}
    want = reference(ds, **kw)
    loader = unstall.DataLoader(ds, num_workers=1, remote=remote(cluster), **kw)

    def kill_one(n: int) -> None:
        if n == 3:
            os.kill(next(a["Pid"] for a in alive_actors() if a["State"] == "ALIVE"), signal.SIGKILL)

    got = run_epochs(loader, each=kill_one)
    assert same(got, want)
    s = loader.stats()["remote"]
    assert s["resent"] >= 1 and sum(n["failures"] for n in s["nodes"].values()) >= 1, s
    assert sum("lost" in r.getMessage() for r in caplog.records) == 1
    loader.close()


def own_shm(pid: int, namespace: str) -> set[str]:
    """unstall's shared-memory files of one trainer process: its hand-off slots (named with
    its pid) and its cache segments (named with its namespace); other tests beside this one
    make their own."""
    return {n for n in os.listdir("/dev/shm") if f"-p{pid}-" in n or namespace in n}


def test_sigint_mid_epoch_leaves_no_actors_and_no_shared_memory(cluster, tmp_path):
    namespace = f"sigint{os.getpid()}"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            import unstall
            from ray import cloudpickle
            from tests.remote import datasets
            cloudpickle.register_pickle_by_value(datasets)
            remote = unstall.Remote(address={cluster.address!r}, workers=2, wait_up_s=120)
            loader = unstall.DataLoader(datasets.Noisy(4000, sleep_s=0.01), batch_size=4,
                                        num_workers=1, seed=0, remote=remote)
            for n, batch in enumerate(loader):
                if n == 5:
                    print("training", flush=True)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["UNSTALL_SHM_NAMESPACE"] = namespace
    # SIGINT at its default, as in a terminal's job: a process inherits an ignored SIGINT (a
    # test run started as a background job of a non-interactive shell has one), and Python
    # then never raises KeyboardInterrupt (tests/launch/test_signals.py)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"training\n"
        wait_for(lambda: len(alive_actors()) == 2, 30, "the script's 2 actors")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()
    wait_for(lambda: not alive_actors(), 30, "no actor left after SIGINT")
    assert own_shm(proc.pid, namespace) == set()


FOLDER_SCRIPT = """
import glob, hashlib, os, sys
import numpy as np
import torch
from PIL import Image


class PngFolder(torch.utils.data.Dataset):
    def __init__(self, root):
        self.paths = sorted(glob.glob(os.path.join(root, "*.png")))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x = torch.from_numpy(np.asarray(Image.open(self.paths[i]).convert("RGB")).copy())
        x = x.permute(2, 0, 1)
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return x, i


torch.manual_seed(0)
loader = torch.utils.data.DataLoader(
    PngFolder(sys.argv[1]), batch_size=4, shuffle=True, num_workers=1
)
for epoch in range(2):
    for x, y in loader:
        print(hashlib.sha1(x.numpy().tobytes()).hexdigest()[:16], y.tolist(), flush=True)
"""


def test_an_unchanged_torchvision_style_script_under_unstall_run_config(cluster, tmp_path):
    """A plain Dataset of PNG paths (PIL, a random flip), nothing of unstall in the script:
    ``unstall run --config`` with ``remote`` gives the same batches as local workers."""
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    rng = torch.Generator().manual_seed(0)
    for i in range(24):
        pixels = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=rng)
        Image.fromarray(pixels.numpy()).save(images / f"{i:03d}.png")
    script = tmp_path / "train.py"
    script.write_text(FOLDER_SCRIPT)
    outputs = []
    for name, extra in (
        ("local", {}),
        ("remote", {"remote": {"address": cluster.address, "workers": 2, "wait_up_s": 120}}),
    ):
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"kwargs": {"seed": 5, **extra}}))
        report = tmp_path / f"{name}-run.json"
        cmd = [sys.executable, "-m", "unstall", "run", "--json", str(report), "--config"]
        cmd += [str(config), "--", sys.executable, str(script), str(images)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.splitlines())
        (proc,) = json.loads(report.read_text())["processes"]
        (row,) = proc["loaders"]
        if extra:
            assert row["remote"]["batches"] > 0, row["remote"]
            assert "joined the Ray cluster" in done.stderr
            assert "prepared by 2 remote workers" in done.stderr
    assert len(outputs[0]) == 12 and outputs[0] == outputs[1]
    wait_for(lambda: not alive_actors(), 30, "the script's actors to go")


def test_auto_grows_into_remote_workers_once_the_local_ones_are_at_their_cap(cluster):
    """``num_workers="auto"`` with ``remote=``: no remote worker in use at first; the loop
    waits (a sleep-bound dataset, a loop that does nothing) and the tuner grows the local
    pool to its cap, then into the remote workers; the batches stay the local workers' own,
    each sample once an epoch."""
    ds = Noisy(1200, sleep_s=0.004)
    kw = {"batch_size": 4, "shuffle": True, "seed": 5}
    want = reference(ds, 2, **kw)
    loader = unstall.DataLoader(ds, num_workers="auto", remote=remote(cluster), **kw)
    got = run_epochs(loader, 2)
    assert same(got, want)
    t = loader.stats()["autotune"]
    grown = [h for h in t["history"] if h.get("remote_workers", [0, 0])[1] > 0]
    assert grown and grown[0]["remote_workers"][0] == 0, t["history"]
    assert grown[0]["why"] == "loop waits, local workers at their cap"
    assert loader.stats()["remote"]["batches"] > 0
    loader.close()
    wait_for(lambda: not alive_actors(), 30, "the closed loader's actors to go")


def test_a_node_removed_mid_epoch_resends_its_batches(cluster):
    """Last in the module: the cluster keeps one node of 1 CPU after it."""
    ds = Noisy(96, sleep_s=0.02)
    kw = {"batch_size": 4, "shuffle": True, "seed": 8}
    want = reference(ds, **kw)
    loader = unstall.DataLoader(ds, num_workers=1, remote=remote(cluster), **kw)
    victim = next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)

    def remove(n: int) -> None:
        if n == 3:
            cluster.remove_node(victim)

    got = run_epochs(loader, each=remove)
    assert same(got, want)
    s = loader.stats()["remote"]
    assert s["resent"] >= 1 and s["workers_up"] == 1, s
    loader.close()


def test_no_node_left_falls_back_to_local_preparation(cluster, caplog):
    """After the node removal above one node is left: its actor's node goes too, no actor can
    restart, and after ``timeout_s`` the epoch's waiting batches are prepared here."""
    ds = Noisy(64, sleep_s=0.02)
    kw = {"batch_size": 4, "shuffle": True, "seed": 9}
    want = reference(ds, **kw)
    r = remote(cluster, workers=1, timeout_s=2)
    loader = unstall.DataLoader(ds, num_workers=0, remote=r, **kw)
    last = [n for n in cluster.list_all_nodes() if n is not cluster.head_node]
    assert len(last) == 1

    def remove(n: int) -> None:
        if n == 2:
            cluster.remove_node(last[0])

    got = run_epochs(loader, each=remove)
    assert same(got, want)
    s = loader.stats()["remote"]
    assert s["fallback_batches"] >= 1 and s["workers_up"] == 0, s
    assert any(
        "preparing this epoch's remaining batches locally" in r.getMessage() for r in caplog.records
    )
    loader.close()
