"""torch's own DataLoader tests, run with unstall's class swapped in (`torch_suite.py`).

Needs ``$UNSTALL_TORCH_TESTS``: the path of torch's ``test/test_dataloader.py`` (skipped
without it). The seeding tests run here; the whole file: ``python -m tests.loader.torch_suite``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.loader.torch_suite import ENV, run

#: torch's tests of what a worker, a seed or a generator draws: the ones issue 29 is about.
SEEDING = (
    "test_worker_init_fn or test_worker_seed or test_worker_seed_reproducibility"
    " or test_shuffle_reproducibility or test_multi_epochs_reproducibility"
    " or test_sampler_reproducibility"
)


@pytest.fixture
def torch_tests() -> Path:
    path = os.environ.get(ENV)
    if not path or not Path(path).is_file():
        pytest.skip(f"${ENV} names no copy of torch's test/test_dataloader.py")
    pytest.importorskip("expecttest")  # torch's test helpers need it
    return Path(path)


def test_torchs_seeding_tests_pass_with_unstalls_loader(torch_tests):
    done = run(torch_tests, ["-q", "-rfE", "-k", SEEDING], timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 12, out[-2000:]  # both classes, plain + persistent
    assert "where the training loop waited" in done.stderr  # the loaders were unstall's
