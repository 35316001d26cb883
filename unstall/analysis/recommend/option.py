"""One priced option of ``unstall analyze``: the row type every remedy is, and the choice of
the recommendation among them.

An `Option` says what it changes (``remedy``, and the figures of its own in ``facts``), the
config that applies it to the unchanged script (``{"kwargs": {...}}``, what ``unstall run
--config`` takes; None where it takes more), what it needs beyond that (``needs``: an edit
of the script, a Ray cluster, the other jobs of a sweep), its price (samples/s predicted,
and over what was measured), and the cap that binds at that price; or why it has no price
(``unpriced``: never a guess). Every option is made by `option`; its words (what it is,
how to apply it, why it is unpriced) are the report's (`unstall.analysis.report.words`).

The recommendation is the best priced option that pays (`choose`): the loader setting the
search found, replaced by an option predicted `GAIN` x faster that this job can take as it
is; an option priced higher that it cannot take (a cluster it was not given, jobs it does
not run beside) is named beside it with what it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from unstall.analysis.model.predict import Config, Prediction
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend import search

#: What an option may need beyond a config: a change of the script (still this job's to
#: make), and what the analysis cannot see or give the job (never chosen by itself).
EDIT, CLUSTER, SWEEP = "edit", "cluster", "sweep"
#: An option replaces the loader setting where predicted this much faster than it.
GAIN = 1.1
#: What a replaced recommendation keeps of the one it replaces (``instead``): enough to be
#: one itself (`applied`).
INSTEAD = ("kwargs", "config", "changed", "predicted_samples_per_s", "measured_samples_per_s")
INSTEAD += ("predicted_current_samples_per_s",)


@dataclass(frozen=True)
class Job:
    """The measured job the options are priced for: its rates, its loader as it ran, the
    samples/s it measured, what limits it, and the rates not measured (with why)."""

    rates: Rates
    base: Config
    measured: float
    bottleneck: str = "prep"
    unknown: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Option:
    """One priced option (see the module's docstring); made by `option`."""

    remedy: str
    predicted: float | None
    speedup: float | None
    config: Mapping[str, Any] | None = None
    needs: str | None = None
    bound: str | None = None
    unpriced: str | None = None
    eligible: bool = True
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The loader arguments its config sets (empty: none)."""
        return dict((self.config or {}).get("kwargs") or {})


def option(
    remedy: str,
    measured: float,
    price: Prediction | float | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    needs: str | None = None,
    unpriced: str | None = None,
    eligible: bool = True,
    **facts: Any,
) -> Option:
    """The one constructor: ``price`` is the model's `Prediction` (its rate and the cap that
    binds), a rate, or None with ``unpriced`` the key of why (facts name what it lacked).
    ``eligible``: False where the option's own rule keeps it from being recommended."""
    bound = price.bound if isinstance(price, Prediction) else facts.pop("bound", None)
    rate = price.samples_per_s if isinstance(price, Prediction) else price
    if rate is None and unpriced is None:
        raise ValueError(f"remedy {remedy!r} has no price and no reason for none")
    return Option(
        remedy,
        round(rate, 1) if rate is not None else None,
        round(rate / measured, 2) if rate is not None and measured > 0 else None,
        dict(config) if config is not None else None,
        needs,
        bound,
        unpriced,
        eligible,
        facts,
    )


def choose(rec: dict[str, Any], options: list[Option]) -> dict[str, Any]:
    """The recommendation: ``rec`` (the best loader setting, `search.recommend`) or the
    option predicted fastest of those this job can take (eligible, needing at most an edit)
    where it beats ``rec`` by `GAIN` (an ``auto`` row by its own rule, `auto.auto_row`);
    every option priced above the recommendation (by the search's own margin, `search.GAIN`)
    that it is not is listed under ``not_chosen``, each with its ``reason`` (`_reason`),
    fastest first."""
    floor = max(rec["predicted_samples_per_s"], rec["measured_samples_per_s"])
    takes = [
        o
        for o in options
        if o.predicted is not None
        and o.eligible
        and o.needs in (None, EDIT)
        and (o.remedy == "auto" or o.predicted >= GAIN * floor)
    ]
    best = max(takes, key=lambda o: o.predicted or 0.0, default=None)
    out = rec if best is None else replaced(rec, best)
    faster = [
        {
            "remedy": o.remedy,
            "predicted_speedup": o.speedup,
            "reason": _reason(o),
            **{k: o.facts[k] for k in ("jobs", "cluster", "why", "kind") if k in o.facts},
        }
        for o in options
        if o is not best
        and o.predicted is not None
        and o.predicted >= search.GAIN * out["predicted_samples_per_s"]
    ]
    return {**out, "not_chosen": _fastest_each(faster)} if faster else out


def _reason(o: Option) -> str:
    """Why priced option ``o`` is not the recommendation: what it needs that the job lacks
    (a cluster, a sweep), its own rule, or a gain under `GAIN`."""
    if o.needs in (CLUSTER, SWEEP):
        return o.needs
    return "rule" if not o.eligible else "gain"


def replaced(rec: dict[str, Any], o: Option) -> dict[str, Any]:
    """The recommendation as option ``o``; what it replaces kept under ``instead``. Its
    kwargs are ``o``'s config, at which it was priced (an edit-only option keeps ``rec``'s
    loader setting, and names the edit under ``edit``: `unstall run --config` applies that)."""
    current = rec["predicted_current_samples_per_s"]
    out = {k: v for k, v in rec.items() if k not in ("why_unchanged", "instead", "auto")}
    kwargs = o.kwargs if o.config is not None else dict(rec["kwargs"])
    out.update(
        kwargs=kwargs,
        config=_label(o, kwargs),
        changed=True,
        remedy=o.remedy,
        predicted_samples_per_s=o.predicted,
        predicted_speedup=round(o.predicted / current, 3) if o.predicted and current > 0 else None,
        instead={k: rec[k] for k in INSTEAD},
    )
    if o.bound is not None:
        out["bound"] = o.bound
    if o.needs == EDIT:
        out["edit"] = o.remedy
    if o.remedy == "auto":
        out["auto"] = {k: o.facts[k] for k in ("settles_on", "settling", "why") if k in o.facts}
    return out


def applied(rec: dict[str, Any]) -> dict[str, Any]:
    """What ``unstall run --config`` applies of recommendation ``rec``, as a recommendation
    (its kwargs, whether they change the job, their price): ``rec`` itself, or where it needs
    an edit of the script, the loader setting it keeps (``instead``), which ``--verify`` runs."""
    return rec["instead"] if rec.get("edit") else rec


def _label(o: Option, kwargs: dict[str, Any]) -> str:
    workers = kwargs.get("num_workers")
    if o.remedy == "auto":
        workers = f"auto({o.facts.get('settles_on')})"
    cache = kwargs.get("cache") or 0.0
    held = f"{cache['size']}:{cache.get('hold', 'bytes')}" if isinstance(cache, dict) else None
    parts = [f"workers={workers}", f"cache={held or format(float(cache), 'g')}"]
    parts += [f"prep={kwargs['prep']}"] if "prep" in kwargs else []
    return ",".join([*parts, *([f"edit={o.remedy}"] if o.needs == EDIT else [])])


def _fastest_each(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per remedy, its fastest, fastest first."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if (
            r["remedy"] not in best
            or r["predicted_speedup"] > best[r["remedy"]]["predicted_speedup"]
        ):
            best[r["remedy"]] = r
    return sorted(best.values(), key=lambda r: -r["predicted_speedup"])
