"""A second job on the node: a separate Python process that loads the same dataset with a cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.forked import Forked

REPO = str(Path(__file__).resolve().parents[2])

JOB = r"""
import json, sys, time
import unstall
from unstall.cache import list_caches
root, n, fraction, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ds = unstall.FileDataset(root, [f"{i:05d}.bin" for i in range(n)])
cache = unstall.Cache(fraction)
loader = unstall.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, cache=cache)
served = [raw for batch in loader for raw in batch]
intact = sorted(served) == sorted(ds.fetch(range(n)))
report = {"epoch1": loader.stats()["per_epoch"][0]["cache"], "segments": list_caches(),
          "intact": intact}
print(json.dumps(report), flush=True)
if mode == "hang":
    time.sleep(600)
cache.close()
"""


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = REPO + os.pathsep + out.get("PYTHONPATH", "")
    return out


def run_job(root: Path, n: int, fraction: float) -> dict:
    """Run a whole job in another process; its report (first epoch's cache stats, segments)."""
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(root), str(n), str(fraction), "exit"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_job(server, root: Path, n: int, fraction: float) -> tuple[Forked, dict]:
    """Start a job that fills the cache, reports, then hangs (to be killed), forked from the
    fork server ``server`` (`tests.forked.server`): torch is imported there once."""
    argv = ["-c", JOB, str(root), str(n), str(fraction), "hang"]
    output = Path(root).parent / f"job-{fraction}"
    proc = Forked(server, argv, env=env(), cwd=Path.cwd(), output=output)
    line = proc.first_line(timeout=90)
    if not line:
        proc.kill()
        raise AssertionError(proc.output()[1].decode()[-3000:] or "job died")
    return proc, json.loads(line)
