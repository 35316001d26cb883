"""`bench audio`: its figures from the script's epoch lines (pure functions), and a small run
whose output has every row, the caches' contents and the ratios (not its speed: the goals
are the bench's, at its size)."""

from __future__ import annotations

import json
import os

import pytest

from unstall.bench import load
from unstall.bench.audio import CASES, EPOCHS, from_epoch_2, parse_epochs, run, summarize

STDOUT = """\
epoch 1: 64 samples in 2.00 s, 32.0/s
epoch 2: 64 samples in 0.50 s, 128.0/s
epoch 3: 32 samples in 0.30 s, 106.7/s
samples/s: 57.1 (160 samples in 2.80 s)
"""


def test_epoch_lines_are_parsed_and_the_rate_is_from_epoch_2():
    epochs = parse_epochs(STDOUT)
    assert [(e["epoch"], e["samples"], e["seconds"]) for e in epochs] == [
        (1, 64, 2.0),
        (2, 64, 0.5),
        (3, 32, 0.3),
    ]
    assert epochs[0]["samples_per_s"] == pytest.approx(32.0)
    assert from_epoch_2(epochs) == pytest.approx(96 / 0.8)  # all samples over all seconds
    with pytest.raises(ValueError, match="no epoch 2"):
        from_epoch_2(epochs[:1])


def test_ratios_are_taken_within_each_round_then_the_median():
    rounds = [
        {"as_is": 10.0, "bytes": 12.0, "samples": 150.0},
        {"as_is": 20.0, "bytes": 20.0, "samples": 160.0},  # a loaded round: all slower
        {"as_is": 12.0, "bytes": 15.0, "samples": 132.0},
    ]
    s = summarize(rounds)
    assert s["round_ratios"]["samples_vs_as_is"] == pytest.approx([15.0, 8.0, 11.0])
    assert s["ratios"]["samples_vs_as_is"] == pytest.approx(11.0)
    assert s["ratios"]["samples_vs_bytes"] == pytest.approx(8.8)  # 12.5, 8, 8.8
    assert s["ratios"]["bytes_vs_as_is"] == pytest.approx(1.2)  # 1.2, 1.0, 1.25
    assert s["rates"] == {"as_is": 12.0, "bytes": 15.0, "samples": 150.0}
    only_two = summarize([{"as_is": 10.0, "bytes": 11.0}])
    assert set(only_two["ratios"]) == {"bytes_vs_as_is"}


@pytest.mark.timeout(900)
def test_a_small_run_has_every_row_what_each_cache_held_and_the_ratios(tmp_path, monkeypatch):
    pytest.importorskip("soundfile")
    pytest.importorskip("soxr")
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path))  # the clips are made here
    result = run(quick=True, clips=4, seconds=1.0, repeats=1)
    assert load("audio").run is run
    data = json.loads(json.dumps(result.to_json()))
    assert data["benchmark"] == "audio"
    assert [r["case"] for r in data["rows"]] == [label for label, _ in CASES.values()]
    as_is, byte, sample = data["rows"]
    assert as_is["config"] == "-"
    assert json.loads(byte["config"]) == {"kwargs": {"cache": "2GiB"}}
    assert json.loads(sample["config"]) == {
        "kwargs": {"cache": {"size": "2GiB", "hold": "samples"}}
    }
    # soundfile opens the clips in C: the byte cache lists all 4 and never holds one;
    # the sample cache holds every prepared clip after its run
    assert (byte["cached"], sample["cached"]) == ("0/4", "4/4")
    for case, runs in data["runs"].items():
        epochs = runs[0]["epochs"]
        assert [e["samples"] for e in epochs] == [4] * EPOCHS[case]  # every clip, each epoch
    assert set(data["ratios"]) == {"samples_vs_as_is", "samples_vs_bytes", "bytes_vs_as_is"}
    assert data["ratio"] == pytest.approx(data["ratios"]["samples_vs_as_is"], abs=1e-3)
    assert data["ratio"] == pytest.approx(sample["samples_per_s"] / as_is["samples_per_s"], 0.02)
    assert data["clips"] == 4 and data["rounds"] == 1
    left = [n for n in os.listdir("/dev/shm") if f"benchaudio{os.getpid()}" in n]
    assert left == []  # the bench's namespace is cleared
