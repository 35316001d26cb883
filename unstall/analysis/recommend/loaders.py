"""The script's other loaders priced, and the recommendation made to serve every loader.

A config's kwargs apply to every loader the script makes, so the recommendation written
to ``recommendation.json`` must be one that serves them all: the training loader it was
priced for, and the others (most often a validation loader, whose pass the training job
waits for each epoch). The measured loader's price keeps its meaning (its samples/s); each
other loader is priced by the time of its pass.

**Price of a pass under the sample cache** (``Cache(hold="samples")``, from the pass
after the one that fills it), from what the cold run timed of that loader's passes
(`unstall.analysis.measure.script.loaders`) and its dataset's facts (a sample's
preparation ``prep_s`` and its hit ``read_s + collate_s + handoff_s``, timed on its own samples):

- the loop's own time on the pass (``wall - wait``: the evaluation's) is unchanged;
- the first batch's wait loses its batch's preparation, less the hits (the workers'
  start stays);
- the rest of the wait is what ``W`` workers (at most the cores) preparing the other
  samples from the cache do not hide behind the loop's time, never more than measured;
  with no workers the loop pays each sample's saving itself.

For the share of the samples the room holds (the rest prepared as now). A dataset that
failed the determinism check (or lists no file per sample) is never priced: its row says
which check failed, and the config, which applies to it too, gives it its files' bytes as
the cache's binding does (`unstall.cache.points.binding`).

**The config:** where another loader's pass is priced `PAYS` faster, the recommendation
gains ``cache={"size": ..., "hold": "samples"}``: a loader whose dataset passed the check
holds its samples, one that did not holds its files' bytes. Each loader binds a cache of
that size, so the size is the largest need, the node's room shared between the loaders.
A recommendation already holding a byte cache (a fraction or a size) keeps it: that
setting serves every loader as bytes; one that runs the script's folders as unstall's own
pipeline (``prep="lean"``, ``"gpu"``...) does the same to the other loaders' folders, whose
cache then holds their items' bytes. Nor is it applied where the job is bound by its
workers' CPU and the training set fails the check: the setting would cache that set's
files' bytes too, work its workers pay that the training loop's price leaves out (a prep-bound
ImageNet-shaped job's verification fell 14 % under its price with it). Each time the others'
saving is said, not applied.
"""

from __future__ import annotations

import math
from typing import Any

from unstall.analysis.recommend.samples import SIZE_STEP, hit_s
from unstall.cache.capacity import entry_bytes

#: A loader's pass must be priced this much shorter for the recommendation to cache it.
PAYS = 0.1


def price_loaders(
    rows: list[dict[str, Any]],
    measured_facts: dict[str, Any] | None,
    room: float | None,
    cores: float,
) -> list[dict[str, Any]]:
    """The loaders table's rows (the agent's), each other loader's priced under the sample
    cache in its share of ``room`` (bytes; None: not measured, all fit) with ``cores``; the
    measured one's row says what its dataset holds under the same config."""
    active = [r for r in rows if r.get("batches")]
    per_room = None if room is None else room / max(1, len(active))
    measured = next((r for r in rows if r.get("measured")), None)
    epochs = max(1, int((measured or {}).get("iterators") or 1))
    out = []
    for r in rows:
        if r.get("measured"):
            out.append({**r, "holds": _holds(measured_facts)})
        elif r.get("pass") and r.get("sample_cache") is not None:
            out.append(_priced(r, per_room, cores, epochs))
        else:
            out.append(dict(r))
    return out


def _holds(facts: dict[str, Any] | None) -> dict[str, Any]:
    """What ``hold="samples"`` binds for a dataset with these ``facts``."""
    if facts and facts.get("applies"):
        return {"holds": "samples"}
    facts = facts or {"check": "not checked", "why": "the dataset was not checked"}
    return {"holds": "bytes", "check": facts.get("check", ""), "why": facts.get("why", "")}


def _priced(row: dict[str, Any], room: float | None, cores: float, epochs: int) -> dict[str, Any]:
    """``row`` with ``holds`` and, where its dataset passed the check, ``priced``: the pass
    from the second on (module notes) and the seconds saved per pass and per epoch."""
    facts, p = row["sample_cache"], row["pass"]
    out = {**row, "holds": _holds(facts)}
    if not facts.get("applies"):
        return out
    n, batches = int(p["samples"]), max(1, int(p["batches"]))
    need = entry_bytes(facts["bytes_per_sample"]) * int(facts["samples"])
    share = 1.0 if room is None or need <= 0 else min(1.0, room / need)
    prep = float(facts["prep_s"])
    hit = hit_s(facts)
    cached = share * hit + (1.0 - share) * prep
    saved_each = max(0.0, prep - cached)
    wait, first = float(p["wait_s"]), float(p["first_wait_s"])
    loop = max(0.0, float(p["wall_s"]) - wait)  # the loop's own time: the evaluation's
    workers = int(row.get("num_workers") or 0)
    if workers == 0:
        wait_after = max(0.0, wait - n * saved_each)
    else:
        batch = int(row.get("batch_size") or 0) or max(1, round(n / batches))
        first_after = max(0.0, first - batch * saved_each)
        ahead = max(1.0, min(float(workers), cores))
        rest_after = max(0.0, (n - batch) * cached / ahead - loop)
        wait_after = first_after + min(wait - first, rest_after)
    pass_after = loop + wait_after
    saved = max(0.0, float(p["wall_s"]) - pass_after)
    per_epoch = max(1, round(int(row.get("iterators") or 1) / epochs))
    out["priced"] = {
        "pass_s": round(pass_after, 4),
        "saved_s_per_pass": round(saved, 4),
        "saved_s_per_epoch": round(saved * per_epoch, 4),
        "passes_per_epoch": per_epoch,
        "share": round(share, 3),
        "need_bytes": need,
        "from_pass": 2,
        "cpu_ms_per_sample": {"now": round(prep * 1e3, 3), "cached": round(cached * 1e3, 3)},
    }
    return out


def paying(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The other loaders whose pass the sample cache shortens by `PAYS` or more."""
    return [
        r
        for r in rows
        if r.get("priced") and r["priced"]["saved_s_per_pass"] >= PAYS * r["pass"]["wall_s"]
    ]


def serve_all(rec: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``rec`` (the chosen recommendation) with the cache setting that serves every loader
    and ``other_loaders``: what each holds and the seconds saved per epoch (module notes);
    as it is where no other loader was priced."""
    others = [r for r in rows if not r.get("measured") and "holds" in r]
    if not others:
        return rec
    pays = paying(others)
    saved = round(sum(r["priced"]["saved_s_per_epoch"] for r in pays), 4)
    summary: dict[str, Any] = {"loaders": [_entry(r) for r in rows if "holds" in r]}
    current = rec["kwargs"].get("cache")
    held = isinstance(current, dict) and current.get("hold", "bytes") == "samples"
    if not pays:
        summary["why"] = "no other loader's pass is priced faster under the sample cache"
        return {**rec, "other_loaders": summary}
    prep = rec["kwargs"].get("prep")
    measured = next((r for r in rows if r.get("measured")), {})
    # a refused training set gets its files' bytes cached too: a cost to its workers the
    # training loop's price leaves out, which a job bound by its workers' CPU pays in full
    bytes_on_prep = (
        not current
        and rec.get("bound") == "prep"
        and (measured.get("holds") or {}).get("holds") == "bytes"
    )
    if (current and not held) or prep or bytes_on_prep:
        if prep:
            why = (
                f"prep={prep!r} runs every loader's torchvision folder as unstall's own "
                "pipeline, whose cache holds their files' bytes"
            )
        elif current:
            why = (
                f"the recommendation's cache setting ({current!r}) applies to every loader as "
                "their files' bytes"
            )
        else:
            why = (
                "the setting applies to the training loader too, whose dataset fails the "
                "check: its files' bytes would be cached, work its workers (the job's bound) "
                "would pay unpriced"
            )
        summary["why"] = why + ": the sample cache's saving is priced, not applied"
        summary["saved_s_per_epoch_unapplied"] = saved
        return {**rec, "other_loaders": summary}
    size = max(r["priced"]["need_bytes"] * r["priced"]["share"] for r in pays)
    if held:  # the recommendation's own sample cache: `sample_cache_row` sizes it in MiB
        size = max(size, float(int(str(current["size"]).removesuffix("MiB")) << 20))
    size = math.ceil(size / SIZE_STEP) * SIZE_STEP
    cache = {"size": f"{int(size) >> 20}MiB", "hold": "samples"}
    summary["saved_s_per_epoch"] = saved
    out = {k: v for k, v in rec.items() if k != "why_unchanged"}  # it changes now
    out.update(kwargs={**rec["kwargs"], "cache": cache}, changed=True)
    out["config"] = _label(rec.get("config", ""), cache)
    out["other_loaders"] = summary
    if rec.get("edit") and "instead" in rec:  # what --config applies of an edit-only option
        kept = rec["instead"]
        out["instead"] = {**kept, "kwargs": {**kept["kwargs"], "cache": cache}, "changed": True}
        out["instead"]["other_loaders"] = summary
    return out


def _entry(r: dict[str, Any]) -> dict[str, Any]:
    """One loader's line of ``other_loaders``: what it holds, and its pass priced."""
    out = {"index": r["index"], "dataset": r["dataset"], "measured": r["measured"], **r["holds"]}
    if r.get("priced"):
        out["pass_s"] = r["pass"]["wall_s"]
        out["priced_pass_s"] = r["priced"]["pass_s"]
        out["saved_s_per_epoch"] = r["priced"]["saved_s_per_epoch"]
    return out


def _label(label: str, cache: dict[str, Any]) -> str:
    """The recommendation's one-line label with its cache part replaced."""
    parts = [p for p in label.split(",") if p and not p.startswith("cache=")]
    parts.insert(min(1, len(parts)), f"cache={cache['size']}:samples")
    return ",".join(parts)


def against_verified(
    rec: dict[str, Any], measured: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Each priced other loader's pass, priced and as the verification measured it
    (``measured``: its loaders' rows, each with ``later_pass``, the passes after the
    first)."""
    by_index = {r["index"]: r for r in measured or []}
    out = []
    for e in (rec.get("other_loaders") or {}).get("loaders", []):
        if "priced_pass_s" not in e:
            continue
        got_row = by_index.get(e["index"]) or {}
        seen = got_row.get("later_pass")
        row = {"index": e["index"], "dataset": e["dataset"], "priced_pass_s": e["priced_pass_s"]}
        row["pass_s_before"] = e["pass_s"]
        if got_row.get("cache"):
            row["cache"] = got_row["cache"]  # what its cache held and served in the re-run
        if seen:
            got = seen["wall_s"]
            row.update(measured_pass_s=got, passes=seen["of"])
            row["error"] = round(abs(e["priced_pass_s"] - got) / got, 4) if got > 0 else None
        else:
            row["measured_pass_s"] = None
            row["why"] = "the verification's run made no pass of this loader"
        out.append(row)
    return out
