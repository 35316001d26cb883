"""`bench train`: train a real model from local JPEGs, several ways side by side in the same run.

One model, optimizer and step (bf16 autocast on CUDA, channels_last, SGD) are fed in turn,
for the same warm-up and timed steps, by: ``synthetic (G)`` (one batch already on the
device: the model's own rate); ``torch`` (torch's DataLoader, all cores, torchvision's
float32 PIL pipeline); ``unstall cpu-lean`` (uint8 on the workers, normalized on the
device); ``unstall gpu-prep`` (``prep="gpu"``; skipped without CUDA or a usable GPU
decoder); ``unstall hybrid`` (``prep="hybrid"``: the workers prepare a share of every
batch, the GPU stage the rest; its engine runs on the CPU without CUDA); ``DALI (own
pipeline)`` (DALI's own ResNet input pipeline, the rate to compare with; skipped without
DALI). ``detail.gpu_stage`` times the GPU stage's engine alone on the same JPEGs (as
`unstall analyze` prices it; on CUDA also from page-locked memory) beside the rate it kept
in the loader (`unstall.bench.train_stage`). Per unstall variant the JSON has
``main_cpu_ms_per_batch`` (the CPU of the training loop's thread in the loader's
``__next__``) and, for the GPU stage, ``stage_cpu_ms_per_batch`` (its own thread's CPU),
``engine_ms_per_batch`` (CUDA events on a GPU), the DALI feed's, output wait's and copy's ms
per batch, the decoder settings in use and chosen by measurement (``dali_hw_decoder_load``,
``dali_threads``, ``decoder_chosen``, ``decoder_rates``) and each side's measured rate.
Goals on an H100/H200 with 16 cores (``detail.goal``, issue 47): ResNet-18 >= 0.95 of G and
>= 1.15x DALI's own pipeline, ResNet-50 >= 0.99 of G, <= 3 ms of the loop thread's CPU per
batch for every unstall variant. Without CUDA the same code runs tiny on the CPU, so it can
be tested; those figures are not the GPU goal.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from unstall import machine
from unstall.bench.harness import BenchResult, Measurement, frozen_heap, ratio_of, row
from unstall.bench.local import PerSample
from unstall.bench.train_dali import dali_own
from unstall.bench.train_stage import said, stage_check
from unstall.data import ImageFolder
from unstall.loader import DataLoader
from unstall.loader.device import NormalizeImages
from unstall.models.nets import MODELS, build
from unstall.pipeline import ImagePipeline, TorchReferencePipeline
from unstall.stores import LocalStore

DESCRIPTION = "train a real model from local JPEGs: synthetic G, torch, unstall lean, GPU, hybrid"
SYNTHETIC, TORCH, LEAN, GPU_PREP = "synthetic (G)", "torch", "unstall cpu-lean", "unstall gpu-prep"
HYBRID, DALI_OWN = "unstall hybrid", "DALI (own pipeline)"
#: Goals on an H100 with 16 cores: unstall's share of G and unstall / torch, per model; the
#: loop thread's CPU per batch.
GOAL_FRACTION_OF_G = 0.9
GOAL_FRACTION: dict[str, float] = {"resnet18": 0.95, "resnet50": 0.99}
#: unstall's best over DALI's own pipeline, per model (issue 47).
GOAL_VS_DALI: dict[str, float] = {"resnet18": 1.15}
GOAL_RATIO: dict[str, float] = {"resnet50": 2.5, "resnet18": 3.0}
GOAL_MAIN_CPU_MS = 3.0
LOADERS = {
    SYNTHETIC: "one batch already on the device",
    TORCH: "torch, float32 PIL pipeline",
    LEAN: "unstall, uint8, normalized on device",
    GPU_PREP: "unstall, prep='gpu'",
    HYBRID: "unstall, prep='hybrid': CPU workers and the GPU stage on every batch",
    DALI_OWN: "DALI's own reader + random-crop decoder, all threads",
}
#: Keys of the GPU stage's timings, decoder settings and each side's rate lifted from
#: ``prep_plan`` to each variant's figures.
STAGE_KEYS = ("engine_ms_per_batch", "engine_clock", "dali_feed_cpu_ms_per_batch")
STAGE_KEYS += ("dali_wait_ms_per_batch", "dali_wait_cpu_ms_per_batch", "dali_copy_cpu_ms_per_batch")
STAGE_KEYS += ("dali_hw_decoder_load", "dali_threads", "decoder_chosen", "decoder_rates")
STAGE_KEYS += ("cpu_rate_per_s", "gpu_rate_per_s", "cpu_share")
_LAST = torch.channels_last


@dataclass(frozen=True)
class TrainSettings:
    """One run's shape; every variant trains ``batch_size * steps`` timed samples.

    Args:
        model: a name in `unstall.models.nets.MODELS`.
        device: ``"cuda"`` (bf16 autocast) or ``"cpu"`` (float32, for tests).
        batch_size: samples per step.
        image_size: side of the training crops [Unit: pixel].
        warmup_steps: steps run before timing (worker start-up, autotuning).
        steps: timed steps per variant.
        workers: loader worker processes, for torch and unstall alike.
    """

    model: str
    device: str
    batch_size: int
    image_size: int
    warmup_steps: int
    steps: int
    workers: int

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is not known; choose one of {sorted(MODELS)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be 'cuda' or 'cpu'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available: use device='cpu'")
        lows = {"batch_size": 1, "image_size": 32, "warmup_steps": 0, "steps": 1, "workers": 0}
        for name, low in lows.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= {low}")

    @property
    def images(self) -> int:
        """Dataset size: one epoch covers warm-up and timed steps, so no epoch restarts."""
        return self.batch_size * (self.warmup_steps + self.steps)


def settings_for(model: str, *, quick: bool, cuda: bool) -> TrainSettings:
    """The issue's settings on CUDA (batch 256, 224 px); tiny ones on the CPU."""
    workers = machine.cores_available()
    if cuda:
        warmup, steps = (10, 30) if quick else (20, 80)  # warm-up drains the start-up burst
        return TrainSettings(model, "cuda", 256, 224, warmup, steps, workers)
    batch, steps = (8, 4) if quick else (16, 8)
    return TrainSettings(model, "cpu", batch, 112, 2, steps, workers)


class Trainer:
    """The model, optimizer and training step every variant feeds: the same work per step."""

    def __init__(self, settings: TrainSettings):
        self.device = torch.device(settings.device)
        self.cuda = self.device.type == "cuda"
        self.model = build(settings.model).to(self.device, memory_format=_LAST)
        params = self.model.parameters()
        self.optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)

    def step(self, batch: Any) -> int:
        """One SGD step on ``(images, labels)`` (moved to the device if needed); its samples."""
        images, labels = batch
        images = images.to(self.device, non_blocking=True).contiguous(memory_format=_LAST)
        labels = labels.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = F.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return len(labels)

    def sync(self) -> None:
        """Wait for the queued device work, so a timed span ends on finished steps."""
        if self.cuda:
            torch.cuda.synchronize(self.device)


def train(trainer: Trainer, batches: Iterator[Any], s: TrainSettings) -> tuple[int, float, float]:
    """Warm-up steps, then ``s.steps`` timed ones: ``(samples, wall s, host wait s)``."""
    for _ in range(s.warmup_steps):
        trainer.step(_next(batches, s))
    trainer.sync()
    samples, wait = 0, 0.0
    start = time.perf_counter()
    for _ in range(s.steps):
        t0 = time.perf_counter()
        batch = _next(batches, s)
        wait += time.perf_counter() - t0
        samples += trainer.step(batch)
    trainer.sync()
    return samples, time.perf_counter() - start, wait


def _next(batches: Iterator[Any], s: TrainSettings) -> Any:
    batch = next(batches, None)
    if batch is None:
        raise RuntimeError(f"the loader ran out: {s} needs a dataset of {s.images} images")
    return batch


def skip_reason(name: str, device: str) -> str | None:
    """Why a variant cannot run here, or None when it can."""
    from unstall.gpu.engine import available_decoder, dali_importable, decoder_choice

    if name == DALI_OWN and not dali_importable():
        return "DALI is not installed: pip install 'unstall[dali]' (or 'unstall[dali-cu12]')"
    if name != GPU_PREP:
        return None
    if device != "cuda":
        return "no CUDA on this machine: prep='gpu' decodes and augments on the GPU"
    cuda = torch.device("cuda")
    if available_decoder(device=cuda) is None:
        return f"no usable GPU decoder: pip install 'unstall[dali]' ({decoder_choice(cuda)})"
    return None


def variants(s: TrainSettings, store: LocalStore) -> dict[str, Callable[[], Any]]:
    """A maker of each variant's loader: same batches and workers, its own pipeline."""
    common: dict[str, Any] = {"batch_size": s.batch_size, "shuffle": True, "drop_last": True}
    common["num_workers"] = s.workers
    reference = ImageFolder(store, transform=TorchReferencePipeline(s.image_size))
    lean = ImagePipeline(s.image_size, output="uint8")
    normalize = NormalizeImages(lean.mean, lean.std, channels_last=True)
    standard = ImagePipeline(s.image_size)
    on_device = {"device": s.device, "device_transform": normalize, **common}
    return {
        TORCH: lambda: torch.utils.data.DataLoader(
            PerSample(reference), pin_memory=s.device == "cuda", **common
        ),
        LEAN: lambda: DataLoader(ImageFolder(store, transform=lean), prep="cpu", **on_device),
        GPU_PREP: lambda: DataLoader(
            ImageFolder(store, transform=standard), prep="gpu", **on_device
        ),
        HYBRID: lambda: DataLoader(
            ImageFolder(store, transform=standard), prep="hybrid", **on_device
        ),
    }


def run(*, quick: bool, console: Any = None, model: str = "resnet50") -> BenchResult:
    """The issue's run on CUDA; on a machine without CUDA, tiny settings on the CPU."""
    settings = settings_for(model, quick=quick, cuda=torch.cuda.is_available())
    return run_with(settings, console=console)


def run_with(s: TrainSettings, *, console: Any = None) -> BenchResult:
    """Train ``s.model`` from each variant in turn and compare rates with torch and with G."""
    with frozen_heap():  # a full collection after each variant: only the variants' objects
        return _run_with(s, console)


def _run_with(s: TrainSettings, console: Any) -> BenchResult:
    from unstall.data.synthetic import ensure_demo_dataset

    say = console.print if console is not None else (lambda *a: None)
    cuda = s.device == "cuda"
    where = torch.cuda.get_device_name() if cuda else "cpu, float32"
    say(
        f"bench train: {s.model} on {where}, batch {s.batch_size}, {s.image_size} px, "
        f"{'bf16 autocast, ' if cuda else ''}channels_last, SGD; {s.warmup_steps} warm-up + "
        f"{s.steps} timed steps per variant; {s.workers} workers"
    )
    if not cuda:
        say("no CUDA: tiny settings on the CPU; these figures are not the GPU goal")
    root = os.fspath(ensure_demo_dataset(images=s.images, classes=10, seed=0, progress=False))
    store = LocalStore(root)
    warm = ImageFolder(store, raw=True)
    for i in range(0, len(warm), 64):  # page cache warm: every variant reads from memory
        warm.fetch(range(i, min(i + 64, len(warm))))
    benchmark_flag = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        trainer = Trainer(s)
        images = torch.randn(s.batch_size, 3, s.image_size, s.image_size, device=trainer.device)
        labels = torch.randint(0, 10, (s.batch_size,), device=trainer.device)
        fixed = (images.contiguous(memory_format=_LAST), labels)
        runs = {SYNTHETIC: train(trainer, iter(lambda: fixed, None), s)}
        say(f"  {SYNTHETIC:18s} {_rate(runs[SYNTHETIC]):10,.1f} samples/s (G)")
        skipped: dict[str, str] = {}
        host: dict[str, dict[str, Any]] = {}
        makers = {**variants(s, store), DALI_OWN: lambda: dali_own(s, root)}
        for name, make in makers.items():
            reason = skip_reason(name, s.device)
            if reason is not None:
                skipped[name] = reason
                say(f"  {name:18s} skipped: {reason}")
                continue
            loader = make()
            runs[name] = train(trainer, iter(loader), s)  # dropping the iterator stops workers
            if isinstance(loader, DataLoader):
                host[name] = host_costs(loader.stats())
            getattr(loader, "close", lambda: None)()
            del loader
            gc.collect()
            rate, g_rate = _rate(runs[name]), _rate(runs[SYNTHETIC])
            cost = host.get(name)
            extra = (
                f"; per batch: loop thread CPU {cost['main_cpu_ms_per_batch']:.1f} ms, "
                f"device stage {cost['stage_ms_per_batch']:.1f} ms"
                if cost
                else ""
            )
            if cost and "stage_cpu_ms_per_batch" in cost:
                extra += f" (its thread's CPU {cost['stage_cpu_ms_per_batch']:.1f} ms)"
            plan = (cost or {}).get("prep_plan")
            if plan:
                extra += f"; {plan['cpu_share']:.0%} on the CPU workers, rest {plan['engine']}"
                extra += f" ({plan['engine_ms_per_batch']:.1f} ms/batch, {plan['engine_clock']})"
                if "dali_feed_cpu_ms_per_batch" in plan:
                    extra += (
                        f", DALI feed {plan['dali_feed_cpu_ms_per_batch']:.2f} ms CPU, "
                        f"outputs wait {plan['dali_wait_ms_per_batch']:.2f} ms, "
                        f"hw_decoder_load {plan.get('dali_hw_decoder_load')}, "
                        f"{plan.get('dali_threads')} DALI threads"
                    )
            say(f"  {name:18s} {rate:10,.1f} samples/s, {rate / g_rate:.2f} of G{extra}")
        staged = [n for n in (GPU_PREP, HYBRID) if "prep_plan" in host.get(n, {})]
        ran = {n: (_rate(runs[n]), host[n]["prep_plan"]) for n in staged}
        stage = stage_check(root, s.device, s.batch_size, s.image_size, s.workers, ran)
        if stage is not None:
            say(said(stage))
    finally:
        torch.backends.cudnn.benchmark = benchmark_flag
    return _result(s, runs, skipped, where, host, stage)


def host_costs(stats: dict[str, Any]) -> dict[str, Any]:
    """The training process's CPU per batch and the device stage's host time per batch [ms]."""
    stage = stats.get("stage", {})
    out: dict[str, Any] = {
        "main_cpu_ms_per_batch": stats["main_cpu_ms_per_batch"],
        "stage_ms_per_batch": stage.get("mean_ms", 0.0),
    }
    if "stage_cpu_ms_per_batch" in stats:  # the GPU stage's own thread, beside the loop's
        out["stage_cpu_ms_per_batch"] = stats["stage_cpu_ms_per_batch"]
    plan = stats.get("prep_plan", {})
    if "engine" in plan:  # which side prepared what, with which engine, in how long
        out["prep_plan"] = plan
        out.update({key: plan[key] for key in STAGE_KEYS if key in plan})
    return out


def _rate(run: tuple[int, float, float]) -> float:
    return run[0] / run[1]


def _result(
    s: TrainSettings,
    runs: dict[str, tuple[int, float, float]],
    skipped: dict[str, str],
    where: str,
    host: dict[str, dict[str, Any]],
    stage: dict[str, Any] | None = None,
) -> BenchResult:
    g_rate, torch_rate = _rate(runs[SYNTHETIC]), _rate(runs[TORCH])
    figures, rows = {}, []
    for name, (samples, wall, wait) in runs.items():
        own = samples / g_rate  # the model's own time for these samples: the rest is stall
        m = Measurement(samples, wall, max(0.0, wall - own), min(own, wall), s.steps)
        vs_torch = ratio_of(m.samples_per_s, torch_rate)
        figures[name] = {
            "loader": LOADERS[name],
            "samples": samples,
            "steps": s.steps,
            "wall_s": round(wall, 6),
            "samples_per_s": round(m.samples_per_s, 4),  # tiny CPU rates: keep the ratio exact
            "stall_fraction": round(m.stall_fraction, 4),
            "fraction_of_G": round(m.samples_per_s / g_rate, 4),
            "ratio_vs_torch": round(vs_torch, 4),
            "host_wait_s": round(wait, 6),
            **host.get(name, {}),
        }
        ratio = None if name == TORCH else vs_torch
        rows.append(
            row(name, LOADERS[name], m, ratio, fraction_of_G=figures[name]["fraction_of_G"])
        )
    best = max((n for n in runs if n.startswith("unstall")), key=lambda n: _rate(runs[n]))
    goal_ratio = GOAL_RATIO.get(s.model)
    goal_fraction = GOAL_FRACTION.get(s.model, GOAL_FRACTION_OF_G)
    cpu_note = "no CUDA: tiny CPU settings (float32, no autocast); the model, not the loader, "
    cpu_note += "bounds these figures: they are not the GPU goal"
    return BenchResult(
        name="train",
        ratio=ratio_of(_rate(runs[best]), torch_rate),
        baseline={"variant": TORCH, **figures[TORCH]},
        unstall={"variant": best, **figures[best]},
        rows=rows,
        detail={
            "model": s.model,
            "device": where,
            "G_samples_per_s": round(g_rate, 2),
            "variants": figures,
            "skipped": skipped,
            "goal": {
                "fraction_of_G": goal_fraction,
                "ratio": goal_ratio,
                "vs_dali_own": GOAL_VS_DALI.get(s.model),
                "main_cpu_ms_per_batch": GOAL_MAIN_CPU_MS,
            },
            "best_vs_dali_own": (
                round(_rate(runs[best]) / _rate(runs[DALI_OWN]), 4) if DALI_OWN in runs else None
            ),
            "worst_main_cpu_ms_per_batch": max(
                (h["main_cpu_ms_per_batch"] for h in host.values()), default=None
            ),
            "config": {**asdict(s), "images": s.images},
            "gpu_stage": stage,
        },
        notes=[
            *([cpu_note] if s.device == "cpu" else []),
            f"{s.steps} timed steps of batch {s.batch_size} per variant after "
            f"{s.warmup_steps} warm-up steps; G = the model's own rate on synthetic device data",
            "stall % = 1 - rate / G: the share of the time the model was not training; "
            "top-level ratio: best unstall variant / torch",
            f"goal on an H100 with 16 cores: unstall >= {goal_fraction:.0%} of G"
            + (f", about {goal_ratio}x torch or more" if goal_ratio else "")
            + f", <= {GOAL_MAIN_CPU_MS:g} ms of the loop thread's CPU per batch",
            *(f"skipped {name}: {reason}" for name, reason in skipped.items()),
        ],
    )
