"""Sharded datasets with the rest of unstall: coordinated prep across jobs, `unstall analyze`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.data.shards.helpers import PER_SHARD, SHARDS, make_tars

N = SHARDS * PER_SHARD
HERE = Path(__file__).resolve().parents[3]
MEMBER = """
import json, sys, time, os
import unstall
from unstall.data.shards import TarShards
from tests.data.shards.helpers import ids_collate
shards, group, barrier, k, out = sys.argv[1:6]
ds = TarShards(shards, shuffle="window", window=2)
loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2,
                            collate_fn=ids_collate, coordinate=group)
open(os.path.join(barrier, str(os.getpid())), "w").close()
deadline = time.monotonic() + 30
while len(os.listdir(barrier)) < int(k) and time.monotonic() < deadline:
    time.sleep(0.01)
seen = [[i for b in loader for i in b.tolist()] for _ in range(2)]
stats = loader.stats()["coordination"]
loader.close()
json.dump({"seen": seen, "stats": {k: stats[k] for k in
          ("prepared_for_group", "prepared_privately")}}, open(out, "w"))
"""


def test_two_jobs_coordinate_over_tar_shards(tmp_path):
    """Two jobs over the same tar shards prepare each batch once between them and each sees
    the order of a loader of its own (the shard-window order), every sample once per epoch."""
    import unstall
    from tests.data.shards.helpers import epoch_ids, ids_collate
    from unstall.data.shards import TarShards

    shards = tmp_path / "shards"
    make_tars(shards)
    solo = unstall.DataLoader(
        TarShards(shards, shuffle="window", window=2), batch_size=4, shuffle=True, seed=3,
        collate_fn=ids_collate,
    )  # fmt: skip
    expected = [epoch_ids(solo) for _ in range(2)]
    group, barrier = f"shards-{os.getpid()}", tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, PYTHONPATH=str(HERE))
    procs = []
    for j in range(2):
        argv = [sys.executable, "-c", MEMBER, str(shards), group, str(barrier), "2",
                str(tmp_path / f"m{j}.json")]  # fmt: skip
        procs.append(
            subprocess.Popen(
                argv, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    try:
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = [json.loads((tmp_path / f"m{j}.json").read_text()) for j in range(2)]
    for r in results:
        assert r["seen"] == expected
        assert all(sorted(epoch) == list(range(N)) for epoch in r["seen"])
    batches = -(-N // 4) * 2
    assert sum(r["stats"]["prepared_for_group"] for r in results) == batches
    assert sum(r["stats"]["prepared_privately"] for r in results) == 0


TRAIN = """
import sys, time
import unstall
from unstall.data.shards import TarShards


def burn(x):  # 4 ms of CPU per sample: the prep
    end = time.thread_time() + 0.004
    while time.thread_time() < end:
        pass
    return bytes(x)[:8]


ds = TarShards(sys.argv[1], transform=burn)
loader = unstall.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                            collate_fn=lambda b: [y for _, y in b])
for epoch in range(400):
    for labels in loader:
        time.sleep(0.001)  # the model: 8,000 samples/s
"""


def test_analyze_a_script_over_tar_shards(tmp_path):
    """`unstall analyze --quick` on a script that reads tar shards: its loader found and
    measured, the 4 ms of CPU per sample named the limit (prep), the model's rate found."""
    from tests.analysis.conftest import run_analyze

    shards = tmp_path / "shards"
    make_tars(shards, shards=4, per_shard=60)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    report = run_analyze(
        tmp_path, ["--quick"], [sys.executable, str(script), str(shards)], timeout=200,
        pythonpath=str(HERE),
    )  # fmt: skip
    assert [r["dataset"] for r in report["loaders"]] == ["TarShards"], report["loaders"]
    assert report["bottleneck"] == "prep", report["summary"]
    assert report["ingestion_rate"] > 2000, report["runs"]  # the model alone: ~8,000/s
    assert report["prep_rate"] is not None, report["not_measured"]
