"""`bench shards`' result: the JSON keys the issue asks for, computed from the runs."""

from __future__ import annotations

from unstall.bench.shards import LOADERS, _result


def _runs(e1: float, e2: float, gets: list[int] | None = None, exact: bool = True):
    return [{"s": [e1, e2], "exact": [exact, True], "gets": gets or []} for _ in range(3)]


def test_ratios_gets_and_exact_from_the_runs():
    by = {name: _runs(2.0, 1.0, [20, 0] if name.startswith("unstall") else None)
          for name in LOADERS}  # fmt: skip
    by["unstall tar"] = _runs(1.0, 0.5, [19, 0])
    results = {0: by, 20: {**by, "mosaic mds": _runs(61.0, 1.0)}}
    out = _result(results, 2000, quick=True).to_json()
    assert out["vs_mosaic_epoch1"] == 2.0 and out["vs_mosaic_epoch2"] == 2.0  # at 0 ms
    assert abs(out["vs_mosaic_by_latency"]["20"]["epoch1"] - 61.0) < 0.1
    assert out["gets_per_sample"] == 20 / 2000  # the highest of unstall's shard rows
    assert out["exact"] is True
    assert out["epoch1_runs_over_30s"] == {"20 ms mosaic mds": 3}
    by["webdataset tar"] = _runs(2.0, 1.0, exact=False)
    assert _result({0: by}, 2000, quick=True).to_json()["exact"] is False


def test_mosaic_imports_with_the_torchvision_stand_in():
    import pytest

    try:
        from unstall.bench.shards_rig import import_streaming

        streaming = import_streaming()
    except ImportError as exc:
        pytest.skip(f"mosaicml-streaming not installed: {exc}")
    assert hasattr(streaming, "MDSWriter") and hasattr(streaming, "StreamingDataset")


def test_scale_samples_are_distinct_and_numbered():
    from unstall.bench.shards_scale import _number, samples

    base = [(b"\xff\xd8jpeg-a\xff\xd9", 0), (b"\xff\xd8jpeg-b\xff\xd9", 1)]
    got = list(samples(base, 5))
    assert [n for n, _d, _l in got] == list(range(5))
    assert len({d for _n, d, _l in got}) == 5  # each sample distinct, though 2 images
    assert [_number(d) for _n, d, _l in got] == list(range(5))
    assert [label for _n, _d, label in got] == [0, 1, 0, 1, 0]


def test_scale_goals_from_the_runs():
    from unstall.bench.shards_scale import LOADERS, _result

    def got(first, e1, e2):
        return {"first_batch_s": first, "epochs_s": [e1, e2], "exact": [True, True]}

    by = {name: got(1.0, 10.0, 5.0) for name in LOADERS}
    by["unstall tar indexed"] = got(1.5, 5.0, 1.0)
    two = {**by, "unstall tar indexed": got(1.65, 10.0, 2.0)}
    built = {"1x": {"samples": 1000}, "2x": {"samples": 2000}}
    out = _result({"1x": {0: by}, "2x": {0: two}}, built, scale_gb=2.0, quick=False).to_json()
    g = out["goals"]["0"]["unstall tar indexed"]
    assert g == {
        "first_batch_vs_webdataset": 1.5,
        "epoch1_vs_webdataset": 2.0,
        "epoch1_vs_mosaic": 2.0,
        "epoch2_vs_webdataset": 5.0,
        "first_batch_2x_vs_1x": 1.1,
    }
    assert out["exact"] is True and out["ratio"] == 2.0


def test_the_scale_mode_imports_the_shared_rig_not_the_comparison():
    """`shards` hands `--scale` to `shards_scale`; `shards_scale` takes what both share from
    `shards_rig`, never from `shards`: no import circle."""
    import ast
    from pathlib import Path

    import unstall.bench.shards_scale as scale

    imported = set()
    for node in ast.walk(ast.parse(Path(scale.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    assert "unstall.bench.shards_rig" in imported
    assert "unstall.bench.shards" not in imported
