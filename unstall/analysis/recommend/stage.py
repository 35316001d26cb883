"""The recommend stage: the loader settings to use and the remedies that change the pipeline,
from the model stage's `Analysis` alone (nothing is measured again here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unstall import machine
from unstall.analysis.model.stage import Analysis
from unstall.analysis.recommend.auto import auto_row
from unstall.analysis.recommend.loaders import price_loaders, serve_all
from unstall.analysis.recommend.option import Job, Option, choose, option
from unstall.analysis.recommend.remedies import Seen, remedies
from unstall.analysis.recommend.search import file_cache_advice, recommend


@dataclass
class Advice:
    """What to do about a measured job.

    Attributes:
        analysis: the model stage's result.
        recommendation: `unstall.DataLoader` arguments and what they are predicted to give:
            the best priced option that pays (`option.choose`).
        remedies: every option priced beside the loader setting (the ``auto`` row always),
            each priced or said unpriced.
        loaders: the script's loaders, each other loader's pass priced under the sample
            cache (`unstall.analysis.recommend.loaders`); empty for one loader.
    """

    analysis: Analysis
    recommendation: dict[str, Any]
    remedies: list[Option] = field(default_factory=list)
    loaders: list[dict[str, Any]] = field(default_factory=list)


def advise(a: Analysis) -> Advice:
    """The recommendation and the remedies for ``a``: the best loader setting the search
    finds, the remedies and ``num_workers="auto"`` priced beside it, and the best of them
    that pays recommended (`unstall.analysis.recommend.option.choose`)."""
    d, m = a.derived, a.measurement
    job = Job(d.rates, a.base_config, d.measured, a.bottleneck, d.unknown)
    files = d.extra.get("file_cache") or {}
    rec = recommend(
        d.rates,
        a.base_config,
        files["files"] if files.get("applies") else m.num_samples,
        d.measured,
        cache_room_bytes=m.machine.cache_room_bytes,
        unknown=d.unknown,
        shared=d.shared,
    )
    rec.update(file_cache_advice(files, rec))
    seen = Seen(
        lean=m.extra.get("lean_probe"),
        cuda=m.machine.cuda,
        decoder=m.machine.gpu_decoder,
        gpu=m.extra.get("gpu_probe"),
        files=files,
        wire=m.extra.get("wire"),
        cluster=machine.ray_address(),
        samples=with_loop_cost(m.extra.get("sample_cache"), m.docs.get("synthetic")),
        room=m.machine.cache_room_bytes,
        detection=m.extra.get("detection_probe"),
    )
    options = remedies(job, seen, workers=rec["kwargs"]["num_workers"])
    over = d.extra.get("oversubscription") or {}
    auto = auto_row(
        job,
        rec,
        horizon_s=m.runs["cold"].wall_s,
        node_cores=m.cores,
        prefetch=int((m.docs.get("cold") or {}).get("prefetch_factor") or 2),
        ranks=max(1, len(m.ranks)),
        others=float(over.get("cores_used_by_others") or 0.0),
        oversubscription=over or None,
    )
    options.append(unpriced_if_short(auto, m.runs["cold"].wall_s))
    rows = m.extra.get("loaders") or []
    loaders = price_loaders(rows, seen.samples, seen.room, d.rates.cores) if len(rows) > 1 else []
    return Advice(a, serve_all(choose(rec, options), loaders), options, loaders)


def unpriced_if_short(auto: Option, window_s: float) -> Option:
    """The ``auto`` row without its price (and not recommended) where ``window_s``, the run it
    is priced over, is shorter than the time its settling loses: such a price (e.g. "56
    samples/s (0.01x) over 0.2 s") is the window's, not the job's, which pays that settling
    once over a run of minutes or hours. As it is otherwise."""
    lost = (auto.facts.get("settling") or {}).get("seconds_lost")
    if auto.predicted is None or lost is None or window_s >= lost:
        return auto
    keep = ("start", "settles_on", "settled_samples_per_s")
    facts = {k: auto.facts[k] for k in keep if k in auto.facts}
    short = {"window_s": round(window_s, 1), "lost_s": round(lost, 1)}
    return option(
        "auto", 1.0, config=auto.config, unpriced="short", eligible=False, **facts, **short
    )


def with_loop_cost(facts: dict[str, Any] | None, synthetic: dict[str, Any] | None) -> Any:
    """The sample cache's ``facts`` with ``loop_s``: the training process's CPU per sample
    when it runs at the model's rate (the synthetic run's), the main-process cost the
    cached job pays per sample. The job as it is measured a few samples a second, where
    the process's CPU per sample is mostly its CPU per second spread over them."""
    if not facts or not facts.get("applies") or not synthetic or not synthetic.get("steps"):
        return facts
    from unstall.analysis.rates.script import figures

    loop_s = figures(synthetic).proc_cpu_s
    return {**facts, "loop_s": round(loop_s, 7)} if loop_s > 0 else facts
