"""What `unstall analyze` costs outside the job: its own process prices a script's runs
without importing torch, and the job's process imports no torchvision it did not import
itself (the detection probe looks only where ``transforms.v2`` is loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from unstall.analysis.measure.script.detection import detection_probe

#: Refuses torch and torchvision in the process it runs in: an import of either fails loudly.
BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'torchvision'):\n"
    "            raise ImportError(f'imported {name}')\n"
    "sys.meta_path.insert(0, Block())\n"
)


def without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=60
    )


def test_the_analyzers_process_prices_without_torch():
    # what `unstall analyze -- CMD` imports in its own process, and the machine it reads
    # with the job's process's word on CUDA (the one step that imported torch there)
    done = without_torch(
        "from unstall.cli import analyze\n"
        "from unstall.analysis.pipeline import analyze_script\n"
        "from unstall.analysis.measure.machine import read_machine\n"
        "m = read_machine(cuda=False)\n"
        "assert m.cuda is False and m.cores >= 1, m\n"
        "print(m.gpu_decoder)\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_detection_probe_leaves_a_job_without_torchvision_as_it_is(monkeypatch):
    class Boxes:  # would fail the probe loudly if it were looked at
        def __len__(self) -> int:
            raise AssertionError("looked at")

    for name in [n for n in sys.modules if n.startswith("torchvision.transforms.v2")]:
        monkeypatch.delitem(sys.modules, name)
    assert detection_probe(Boxes()) is None


def test_the_detection_probe_still_looks_where_v2_is_loaded():
    pytest.importorskip("torchvision.transforms.v2")
    looked = []

    class Seen:
        def __len__(self) -> int:
            looked.append(True)
            return 0

    assert detection_probe(Seen()) is None and looked == [True]
