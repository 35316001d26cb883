"""`bench train`: torchvision-exact models, and the benchmark end to end on the CPU, tiny."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from unstall.bench import BenchResult, write_json
from unstall.bench import overhead as overhead_bench
from unstall.bench import train as train_bench
from unstall.bench.train import (
    DALI_OWN,
    GPU_PREP,
    HYBRID,
    LEAN,
    SYNTHETIC,
    TORCH,
    TrainSettings,
    run_with,
)
from unstall.models.nets import MODELS, build

#: ``sum(p.numel() for p in torchvision.models.<name>().parameters())``
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_models_have_torchvisions_parameter_counts(name):
    model = build(name)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_map_images_to_class_scores(name):
    model = build(name, num_classes=10).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_bad_model_and_settings_are_named():
    with pytest.raises(ValueError, match="model='vgg16'"):
        build("vgg16")
    with pytest.raises(ValueError, match="num_classes=0"):
        build("resnet18", num_classes=0)
    with pytest.raises(ValueError, match="batch_size=0"):
        TrainSettings("resnet18", "cpu", 0, 64, 1, 2, 1)
    with pytest.raises(ValueError, match="model='alexnet'"):
        TrainSettings("alexnet", "cpu", 4, 64, 1, 2, 1)


def test_quick_settings_on_cpu_stay_tiny():
    s = train_bench.settings_for("resnet50", quick=True, cuda=False)
    assert s.device == "cpu" and s.model == "resnet50"
    assert s.batch_size <= 8 and s.steps <= 4 and s.images <= 64


def test_train_reports_every_variant_and_the_ratio(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "cache"))
    settings = TrainSettings("resnet18", "cpu", 4, 32, warmup_steps=1, steps=2, workers=1)
    write_json(run_with(settings), str(tmp_path / "train.json"))
    out = json.loads((tmp_path / "train.json").read_text())

    assert out["benchmark"] == "train" and out["model"] == "resnet18"
    variants = out["variants"]
    assert set(variants) >= {SYNTHETIC, TORCH, LEAN, HYBRID}  # hybrid: a CPU engine without CUDA
    assert set(variants) | set(out["skipped"]) == {
        SYNTHETIC,
        TORCH,
        LEAN,
        GPU_PREP,
        HYBRID,
        DALI_OWN,
    }
    plan = variants[HYBRID]["prep_plan"]
    assert plan["mode"] == "hybrid" and plan["cpu_samples"] > 0 and plan["gpu_samples"] > 0
    if not torch.cuda.is_available():
        assert "no CUDA" in out["skipped"][GPU_PREP]
        assert any("not the GPU goal" in note for note in out["notes"])
    for figures in variants.values():
        assert figures["samples_per_s"] > 0
        assert figures["samples"] == settings.batch_size * settings.steps
        assert 0 <= figures["stall_fraction"] < 1
    g = variants[SYNTHETIC]["samples_per_s"]
    for figures in variants.values():
        assert figures["fraction_of_G"] == pytest.approx(figures["samples_per_s"] / g, rel=1e-3)
    unstall = max(v["samples_per_s"] for k, v in variants.items() if k.startswith("unstall"))
    assert out["ratio"] == pytest.approx(unstall / variants[TORCH]["samples_per_s"], rel=1e-3)
    assert out["baseline"]["variant"] == TORCH
    assert out["unstall"]["samples_per_s"] == unstall
    assert [r["case"] for r in out["rows"]][:3] == [SYNTHETIC, TORCH, LEAN]
    assert variants[LEAN]["main_cpu_ms_per_batch"] > 0 and variants[LEAN]["stage_ms_per_batch"] > 0
    assert "stage_ms_per_batch" not in variants[TORCH]  # torch's loader has no stats
    # the GPU stage's engine alone on the same JPEGs, beside what each GPU-stage variant delivered
    stage = out["gpu_stage"]
    staged = [n for n in (GPU_PREP, HYBRID) if n in variants]
    assert list(stage["variants"]) == staged and stage["engine_alone_per_s"] > 0
    for name in staged:
        got = stage["variants"][name]
        assert got["delivered_per_s"] == pytest.approx(variants[name]["samples_per_s"], abs=0.1)
        assert got["stage_measured_per_s"] == variants[name]["prep_plan"]["gpu_rate_per_s"]
        assert got["delivered_over_alone"] == pytest.approx(
            got["delivered_per_s"] / stage["engine_alone_per_s"], abs=1e-3
        )
    assert stage["engine"] == variants[staged[0]]["prep_plan"]["engine"]
    assert stage["stage_alone_per_s"] > 0 and stage["loader_alone_per_s"] > 0
    assert ("engine_alone_page_locked_per_s" in stage) == torch.cuda.is_available()


def test_cli_passes_model_only_to_benchmarks_that_take_it(monkeypatch):
    from unstall.cli import main

    calls: dict[str, dict[str, Any]] = {}
    result = BenchResult(name="fake", ratio=1.0, baseline={}, unstall={})

    def fake_train(*, quick: bool, console: Any = None, model: str = "resnet50") -> BenchResult:
        calls["train"] = {"quick": quick, "model": model}
        return result

    def fake_overhead(*, quick: bool, console: Any = None) -> BenchResult:
        calls["overhead"] = {"quick": quick}
        return result

    monkeypatch.setattr(train_bench, "run", fake_train)
    monkeypatch.setattr(overhead_bench, "run", fake_overhead)
    assert main(["bench", "train", "--quick", "--model", "mobilenet_v2"]) == 0
    assert main(["bench", "overhead", "--model", "resnet18"]) == 0
    assert calls == {
        "train": {"quick": True, "model": "mobilenet_v2"},
        "overhead": {"quick": False},
    }
    with pytest.raises(SystemExit):
        main(["bench", "train", "--model", "vgg16"])


def test_a_failing_stage_timing_is_said_and_costs_the_bench_nothing(tmp_path, monkeypatch):
    from tests.conftest import write_jpegs
    from unstall.bench import train_stage

    root = write_jpegs(tmp_path, 8, classes=2, seed=1)

    def broken(*args: Any) -> float:
        raise RuntimeError("boom")

    monkeypatch.setattr(train_stage, "stage_alone", broken)
    monkeypatch.setattr(train_stage, "loader_alone", lambda *args: 123.44)
    ran = {HYBRID: (10.0, {"gpu_rate_per_s": 5.0})}
    check = train_stage.stage_check(str(root), "cpu", 4, 64, 1, ran)
    assert check["stage_alone_per_s"] is None and check["stage_alone_error"] == "RuntimeError: boom"
    assert check["loader_alone_per_s"] == 123.4 and "loader_alone_error" not in check
    assert check["variants"][HYBRID]["delivered_per_s"] == 10.0 and check["engine_alone_per_s"] > 0
    assert "RuntimeError: boom" in train_stage.said(check) and "123/s" in train_stage.said(check)
    assert train_stage.stage_check(str(root), "cpu", 4, 64, 1, {}) is None  # no GPU variant ran
