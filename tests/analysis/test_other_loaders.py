"""Every loader of a script priced, not only the one that carries the training loop.

The script (tests/analysis/scripts/valid_train.py, nothing of unstall in it) trains on an
``ImageFolder`` with ``RandomResizedCrop`` and evaluates each epoch on another with
``Resize(256) + CenterCrop(224) + ToTensor + Normalize``. Its model is slow enough (150 ms a
batch) that the training loop is compute-bound: the recommendation for the training loader
keeps its setting, and the validation pass is what a cache can shorten. ``unstall analyze``
must price that pass under the sample cache, say its dataset passed the determinism check,
write a config that serves both loaders (the training set's bytes, the validation set's
samples) and, under ``--verify``, measure the pass again beside its price. A validation set
with a hidden draw gets no sample cache, with the check that failed.

The pricing and the config are also checked on set figures (`price_loaders`, `serve_all`),
and the passes on set handouts (`passes`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.analysis.conftest import run_analyze
from tests.scripts import load_script
from unstall.analysis.measure.script.loaders import (
    later_pass,
    loader_rows,
    passes,
    typical_pass,
)
from unstall.analysis.measure.steady import Handout
from unstall.analysis.recommend.loaders import against_verified, price_loaders, serve_all

SCRIPT = Path(__file__).resolve().parent / "scripts" / "valid_train.py"
#: Training epochs of 12 batches of 8: each iterator's start-up burst (2 workers x prefetch 2
#: = 4 batches) is left out of the steady state, so epochs of 6 (48 images) gave 2 steady steps
#: each and a run took ~10 epochs to measure (the verified analysis 60 s on one core, 32 s now).
TRAIN, VAL = 96, 32
OPTIONS = ["--steps", "8", "--warmup", "2", "--min-seconds", "2", "--quick"]
#: A slow model: the training loop compute-bound, on one core or two (the two workers prepare
#: a batch in ~50 ms of CPU).
SCRIPT_ARGS = ["--epochs", "60", "--step-ms", "150"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TRAIN and VAL JPEGs of 400x300 in two classes each, dated two minutes back (the
    cache stores no file written in its last seconds)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    old = time.time() - 120
    y, x = np.mgrid[0:300, 0:400]
    for split, n in (("train", TRAIN), ("val", VAL)):
        for i in range(n):
            folder = root / split / f"c{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            image = np.stack([(x + 7 * i) % 256, (2 * y + i) % 256, ((x + y) // 2) % 256], -1)
            image = (image + rng.integers(0, 24, image.shape)).clip(0, 255).astype(np.uint8)
            path = folder / f"{i:03d}.jpg"
            Image.fromarray(image).save(path, quality=90)
            os.utime(path, (old, old))
    return root


def _h(t: float, wait: float, n: int, seg: int) -> Handout:
    return Handout(t, wait, n, seg)


def test_passes_are_per_iterator_with_the_loops_time_on_the_last_batch() -> None:
    # pass 0: asked at 0.0, three batches handed at 0.5, 0.6, 0.7 (waits 0.5, 0.05, 0.05)
    handed = [_h(0.5, 0.5, 8, 0), _h(0.6, 0.05, 8, 0), _h(0.7, 0.05, 4, 0)]
    handed += [_h(2.2, 0.2, 8, 1), _h(2.4, 0.1, 8, 1), _h(2.6, 0.1, 4, 1)]
    first, second = passes(handed)
    assert first["batches"] == 3 and first["samples"] == 20
    assert first["wait_s"] == pytest.approx(0.6) and first["first_wait_s"] == 0.5
    # 0.7 s from the first request to the last batch, plus the loop's 0.05 s a batch
    assert first["wall_s"] == pytest.approx(0.75)
    assert second["wall_s"] == pytest.approx(0.6 + 0.1)
    assert typical_pass([first, second], 3)["wall_s"] == pytest.approx(0.7)
    later = later_pass([first, second], 3)
    assert later["of"] == 1 and later["wall_s"] == second["wall_s"] and not later["first"]
    assert typical_pass([first], 4)["whole"] is False


FACTS = {"applies": True, "samples": 48, "bytes_per_sample": 600_000, "read_s": 0.0006}
FACTS.update(collate_s=0.0001, prep_s=0.025, how="checked")
#: A validation pass of 48 samples: 0.30 s first wait (its batch and the workers' start),
#: 0.20 s more wait, 0.05 s of evaluation.
PASS = {"batches": 6, "samples": 48, "wait_s": 0.5, "first_wait_s": 0.3, "wall_s": 0.55}
ROWS = [
    {"index": 0, "dataset": "ImageFolder", "batches": 60, "iterators": 10, "measured": True},
    {
        "index": 1,
        "dataset": "ImageFolder",
        "batches": 60,
        "iterators": 10,
        "measured": False,
        "num_workers": 2,
        "batch_size": 8,
        "pass": PASS,
        "sample_cache": FACTS,
    },
]
REFUSED = {"applies": False, "check": "random op", "why": "transform has RandomResizedCrop"}


def test_a_deterministic_validation_pass_is_priced_and_the_config_serves_both() -> None:
    rows = price_loaders(ROWS, REFUSED, room=None, cores=2.0)
    assert rows[0]["holds"] == {"holds": "bytes", **{k: REFUSED[k] for k in ("check", "why")}}
    priced = rows[1]["priced"]
    # first wait loses its batch's preparation (8 x 24.3 ms), the rest hides behind nothing:
    # 40 samples x 0.7 ms / 2 workers = 14 ms, less the 50 ms of evaluation: 0
    first = 0.3 - 8 * (0.025 - 0.0007)
    assert priced["pass_s"] == pytest.approx(0.05 + first, abs=1e-4)
    assert priced["saved_s_per_pass"] == pytest.approx(0.55 - 0.05 - first, abs=1e-4)
    assert priced["share"] == 1.0 and priced["passes_per_epoch"] == 1
    rec = {"kwargs": {"num_workers": 2}, "config": "workers=2,cache=0", "changed": False}
    rec.update(predicted_samples_per_s=50.0, why_unchanged="the job is compute-bound")
    out = serve_all(rec, rows)
    assert "why_unchanged" not in out  # it changes the loaders now
    assert out["kwargs"] == {"num_workers": 2, "cache": {"size": "64MiB", "hold": "samples"}}
    assert out["changed"] and out["config"] == "workers=2,cache=64MiB:samples"
    assert out["predicted_samples_per_s"] == 50.0  # the training loop's price, unchanged
    held = out["other_loaders"]["loaders"]
    assert [(e["index"], e["holds"]) for e in held] == [(0, "bytes"), (1, "samples")]
    assert held[0]["check"] == "random op"
    assert out["other_loaders"]["saved_s_per_epoch"] == priced["saved_s_per_epoch"]
    verified = [{"index": 1, "later_pass": {"wall_s": 0.1, "of": 4}, "cache": {"hits": 96}}]
    (pair,) = against_verified(out, verified)
    assert pair["measured_pass_s"] == 0.1 and pair["passes"] == 4 and pair["cache"]["hits"] == 96
    assert pair["error"] == round(abs(priced["pass_s"] - 0.1) / 0.1, 4)


def test_the_room_shared_by_the_loaders_prices_a_share() -> None:
    entry = int(600_000 * 1.25) + 4096
    rows = price_loaders(ROWS, REFUSED, room=2 * entry * 24, cores=2.0)  # half each
    assert rows[1]["priced"]["share"] == 0.5
    assert rows[1]["priced"]["cpu_ms_per_sample"]["cached"] == pytest.approx(
        (0.5 * 0.0007 + 0.5 * 0.025) * 1e3, abs=1e-3
    )


def test_a_failed_check_gets_no_cache_and_says_which() -> None:
    drawn = {"applies": False, "check": "generator untouched", "why": "dataset[0] draws"}
    rows = price_loaders([ROWS[0], {**ROWS[1], "sample_cache": drawn}], REFUSED, None, 2.0)
    assert "priced" not in rows[1] and rows[1]["holds"]["check"] == "generator untouched"
    rec = {"kwargs": {"num_workers": 2}, "config": "workers=2,cache=0", "changed": False}
    out = serve_all(rec, rows)
    assert out["kwargs"] == {"num_workers": 2} and not out["changed"]
    assert out["other_loaders"]["why"].startswith("no other loader's pass")


def test_a_recommendation_that_adapts_the_folders_keeps_its_cache() -> None:
    rows = price_loaders(ROWS, REFUSED, room=None, cores=2.0)
    rec = {"kwargs": {"num_workers": 2, "prep": "lean"}, "config": "workers=2,cache=0,prep=lean"}
    out = serve_all({**rec, "changed": True}, rows)
    assert out["kwargs"] == rec["kwargs"]
    assert out["other_loaders"]["why"].startswith("prep='lean' runs every loader's")
    assert out["other_loaders"]["saved_s_per_epoch_unapplied"] > 0


@pytest.mark.timed
@pytest.mark.timeout(300)
def test_the_validation_loader_is_priced_and_verified(tmp_path, root):
    command = [sys.executable, str(SCRIPT), str(root), *SCRIPT_ARGS]
    report = run_analyze(tmp_path, [*OPTIONS, "--verify"], command)
    assert report["bottleneck"] == "compute", (report["stall"], report["runs"])
    train, val = report["loaders"]
    assert train["measured"] and train["dataset"] == val["dataset"] == "ImageFolder"
    assert train["holds"]["holds"] == "bytes" and train["holds"]["check"] == "random op"
    facts = val["sample_cache"]
    assert facts["applies"] and facts["how"] == "checked" and facts["samples"] == VAL, facts
    # a float32 3x224x224 tensor and its label, as the codec stores them
    assert 3 * 224 * 224 * 4 <= facts["bytes_per_sample"] < 3 * 224 * 224 * 4 + 1024, facts
    assert val["pass"]["samples"] == VAL and val["pass"]["batches"] == VAL // 8, val["pass"]
    assert val["holds"] == {"holds": "samples"}
    priced = val["priced"]
    assert 0 < priced["pass_s"] < val["pass"]["wall_s"] and priced["share"] == 1.0, priced
    rec = report["recommendation"]
    assert rec["kwargs"]["cache"] == {"size": "64MiB", "hold": "samples"}, rec
    assert "applies" not in rec or '"hold": "samples"' in rec["applies"], rec  # the whole config
    held = {e["index"]: e["holds"] for e in rec["other_loaders"]["loaders"]}
    assert held == {0: "bytes", 1: "samples"}, rec["other_loaders"]
    config = (tmp_path / "html" / "recommendation.json").read_text()
    assert '"hold": "samples"' in config
    v = report["verified"]
    (pair,) = v["loaders"]
    assert pair["index"] == 1 and pair["priced_pass_s"] == priced["pass_s"], pair
    assert pair["measured_pass_s"] > 0 and pair["passes"] >= 1, pair
    # the re-run's validation loader served every sample from its cache
    assert pair["cache"]["level"] == "samples" and pair["cache"]["misses"] == 0, pair
    assert pair["cache"]["hits"] >= VAL and pair["cache"]["items_cached"] == VAL, pair
    page = (tmp_path / "html" / "index.html").read_text()
    assert "priced from pass 2" in page and "its samples (checked deterministic)" in page


def test_a_validation_set_with_a_hidden_draw_gets_no_sample_cache(root):
    """The other loaders' rows as the agent builds them in the cold run (`loader_rows`, on
    the script's own ``DrawingFolder``), priced and served: its check fails, with why."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    script = load_script(SCRIPT, "valid_train")
    val_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), script.NORMALIZE])
    train_tf = T.Compose([T.RandomResizedCrop(224), T.ToTensor(), script.NORMALIZE])
    train_set = datasets.ImageFolder(str(root / "train"), train_tf)
    val_set = script.DrawingFolder(str(root / "val"), val_tf)

    def watch(index: int, dataset: object, t0: float) -> SimpleNamespace:
        handed = [_h(t0 + 0.1 * (k + 1), 0.05, 8, 0) for k in range(len(dataset) // 8)]
        loader = DataLoader(dataset, batch_size=8, num_workers=2)
        return SimpleNamespace(index=index, loader=loader, handed=handed, segs=[0])

    train, val = watch(0, train_set, 0.0), watch(1, val_set, 1.0)
    rows = loader_rows([train, val], train, check=True, measured_facts=REFUSED)
    facts = rows[1]["sample_cache"]
    assert not facts["applies"] and facts["check"] == "generator untouched", facts
    assert "draws from random's global generator" in facts["why"], facts
    assert rows[1]["pass"]["samples"] == VAL and rows[1]["pass"]["batches"] == VAL // 8
    rows = price_loaders(rows, REFUSED, None, 2.0)
    assert "priced" not in rows[1] and rows[1]["holds"]["check"] == "generator untouched"
    rec = {"kwargs": {"num_workers": 2}, "config": "workers=2,cache=0", "changed": False}
    out = serve_all(rec, rows)
    assert not isinstance(out["kwargs"].get("cache"), dict), out
    assert out["other_loaders"]["why"].startswith("no other loader's pass"), out


def test_a_prep_bound_job_whose_training_set_fails_the_check_keeps_its_setting() -> None:
    """The cache would bind the refused training set's files' bytes too: on a job bound by
    its workers' CPU that cost is not in the training loop's price, so it is not applied."""
    rows = price_loaders(ROWS, REFUSED, room=None, cores=2.0)
    rec = {"kwargs": {"num_workers": 4}, "config": "workers=4,cache=0", "changed": True}
    out = serve_all({**rec, "bound": "prep"}, rows)
    assert out["kwargs"] == {"num_workers": 4}, out
    assert out["other_loaders"]["why"].startswith("the setting applies to the training loader")
    assert out["other_loaders"]["saved_s_per_epoch_unapplied"] > 0
    applied_here = serve_all({**rec, "bound": "compute"}, rows)  # workers with slack
    assert applied_here["kwargs"]["cache"] == {"size": "64MiB", "hold": "samples"}
