"""The recommend stage: the loader settings to use and the remedies that change the pipeline,
from the model stage's `Analysis` alone (nothing is measured again here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unstall import machine
from unstall.analysis.model.stage import Analysis
from unstall.analysis.recommend.auto import auto_row, with_auto
from unstall.analysis.recommend.remedies import remedies, with_lean
from unstall.analysis.recommend.search import file_cache_advice, recommend


@dataclass
class Advice:
    """What to do about a measured job.

    Attributes:
        analysis: the model stage's result.
        recommendation: `unstall.DataLoader` arguments and what they are predicted to give
            (``num_workers="auto"`` where the ``auto`` row recommends it).
        remedies: unstall's remedies for this bottleneck, each priced or said unmeasured,
            and the ``auto`` row, always.
    """

    analysis: Analysis
    recommendation: dict[str, Any]
    remedies: list[dict[str, Any]] = field(default_factory=list)


def advise(a: Analysis) -> Advice:
    """The recommendation and the remedies for ``a``; ``num_workers="auto"`` priced beside
    the best fixed setting, and recommended instead of it where a fixed count is fragile
    (`unstall.analysis.recommend.auto`)."""
    d, m = a.derived, a.measurement
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
    fixes = remedies(
        d.rates,
        a.base_config,
        bottleneck=a.bottleneck,
        measured=d.measured,
        probe=m.extra.get("lean_probe"),
        unknown=d.unknown,
        cuda=m.machine.cuda,
        decoder=m.machine.gpu_decoder,
        files=files,
        gpu_probe=m.extra.get("gpu_probe"),
        wire=m.extra.get("wire"),
        cluster=machine.ray_address(),
        workers=rec["kwargs"]["num_workers"],
    )
    over = d.extra.get("oversubscription") or {}
    auto = auto_row(
        d.rates,
        a.base_config,
        rec,
        measured=d.measured,
        horizon_s=m.runs["cold"].wall_s,
        node_cores=m.cores,
        unknown=d.unknown,
        prefetch=int((m.docs.get("cold") or {}).get("prefetch_factor") or 2),
        ranks=max(1, len(m.ranks)),
        others=float(over.get("cores_used_by_others") or 0.0),
        oversubscription=over or None,
    )
    auto = unpriced_if_short(auto, m.runs["cold"].wall_s)
    fixes.append(auto)
    if auto["recommended"]:
        rec = with_auto(rec, auto, rec["predicted_current_samples_per_s"])
    lean = next((r for r in fixes if r["remedy"] == "lean" and r.get("config")), None)
    if lean is not None:
        rec = with_lean(rec, lean, a.base_config.workers)
    return Advice(a, rec, fixes)


def unpriced_if_short(auto: dict[str, Any], window_s: float) -> dict[str, Any]:
    """The ``auto`` row without its price (and not recommended) where ``window_s``, the run it
    is priced over, is shorter than the time its settling loses: such a price (e.g. "56
    samples/s (0.01x) over 0.2 s") is the window's, not the job's, which pays that settling
    once over a run of minutes or hours. As it is otherwise."""
    lost = (auto.get("settling") or {}).get("seconds_lost")
    if auto.get("predicted_samples_per_s") is None or lost is None or window_s >= lost:
        return auto
    keep = ("remedy", "what", "applies", "config", "settles_on", "settled_samples_per_s")
    return {
        **{k: auto[k] for k in keep if k in auto},
        "recommended": False,
        "predicted_samples_per_s": None,
        "predicted_speedup": None,
        "not_measured": f"not priced: the measured window lasted {window_s:.1f} s, less than "
        f"the {lost:.1f} s its settling would lose (measure longer: without --quick, or a "
        "larger --min-seconds)",
    }
