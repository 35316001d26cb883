"""`bench detection --quick`'s output: its rows and figures (the structure, not the speed);
and the data it runs on (`make_detection_data`)."""

from __future__ import annotations

import json

import pytest

from unstall.bench.detection import PRESETS, make_detection_data, run


def test_detection_data_is_jpegs_with_boxes_inside(tmp_path) -> None:
    root = make_detection_data(tmp_path / "d", 6, size=(96, 64), seed=2)
    items = json.loads((root / "annotations.json").read_text())["images"]
    assert [i["file"] for i in items] == [f"{k:06d}.jpg" for k in range(6)]
    for item in items:
        assert (root / item["file"]).read_bytes()[:3] == b"\xff\xd8\xff"
        assert 1 <= len(item["boxes"]) == len(item["labels"]) <= 10
        for x0, y0, x1, y1 in item["boxes"]:
            assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 64
    again = make_detection_data(tmp_path / "e", 6, size=(96, 64), seed=2)
    assert (again / "annotations.json").read_text() == (root / "annotations.json").read_text()


@pytest.mark.timeout(900)  # four runs of a script with two workers
def test_quick_bench_has_a_row_per_preset_with_both_sides() -> None:
    # two presets of the three (the headline's and another: rows and ratios kept apart), on
    # small JPEGs: the runs' structure, not their speed
    presets = ("ssd", "hflip")
    result = run(quick=True, images=8, repeats=1, presets=presets, size=(320, 240))
    assert result.name == "detection"
    assert [r["case"] for r in result.rows] == list(presets)
    for row in result.rows:
        assert row["as_is_samples_per_s"] > 0 and row["planned_samples_per_s"] > 0
        assert len(row["as_is_runs"]) == len(row["planned_runs"]) == len(row["pair_ratios"]) == 1
        a, b = row["as_is_samples_per_s"], row["planned_samples_per_s"]
        assert row["pair_ratios"] == [row["ratio"]]  # one pair: its ratio is the median
        rounding = 0.05 / a + 0.05 / b + 1e-3  # the rates are rounded to 0.1, the ratio to 0.001
        assert row["ratio"] == pytest.approx(b / a, rel=rounding)
    assert result.ratio == pytest.approx(result.rows[0]["ratio"], rel=1e-3)
    assert set(result.detail["ratios"]) == set(presets) and result.detail["images"] == 8
    assert result.detail["image_size"] == "320x240"
    compared = result.detail["side_by_side"]
    assert [r["preset"] for r in compared] == list(presets)
    assert all(r["boxes_labels_equal"] for r in compared)  # torchvision's, same draws
    # the flip alone is left as it is by prep="lean" (its pair runs the script on both
    # sides), yet its side-by-side row times the plan: the row says so, and a note
    assert "left_as_is" not in compared[0]
    assert compared[1]["left_as_is"].startswith("nothing to fold")
    assert compared[1]["planned_cpu_ms"] > 0 and compared[1]["pixel_worst"] == 0
    assert sum(n.startswith('hflip: prep="lean" leaves') for n in result.notes) == 1
    with pytest.raises(ValueError, match="ssd first"):
        run(quick=True, presets=("hflip",))
    assert set(presets) < set(PRESETS)
