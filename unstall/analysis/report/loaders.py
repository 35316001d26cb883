"""The words of the loaders table: each loader's pass as measured, its price under the
sample cache (`unstall.analysis.recommend.loaders`) and what the recommendation's config
holds for it, and the verification's passes beside their price. The terminal and the HTML
page show the same cells."""

from __future__ import annotations

from typing import Any

#: The loaders table's columns, in order.
COLUMNS = ("#", "dataset", "batches", "samples", "waited", "pass", "priced from pass 2", "cache")


def cells(row: dict[str, Any]) -> list[str]:
    """One loader's cells (`COLUMNS`)."""
    share = row.get("wait_share")
    p, priced = row.get("pass"), row.get("priced")
    return [
        str(row["index"]),
        row["dataset"],
        str(row["batches"]),
        str(row["samples"]),
        f"{share:.0%}" if share is not None else "-",
        "training loop (measured)"
        if row.get("measured")
        else (f"{p['wall_s']:.3f} s" if p else "-"),
        _priced(priced) if priced else "-",
        holds_text(row.get("holds")),
    ]


def _priced(priced: dict[str, Any]) -> str:
    held = "" if priced["share"] >= 1.0 else f", {priced['share']:.0%} held"
    return f"{priced['pass_s']:.3f} s (saves {priced['saved_s_per_epoch']:.3f} s an epoch{held})"


def holds_text(holds: dict[str, Any] | None) -> str:
    """What ``hold="samples"`` holds for a loader's dataset, and why where not its samples."""
    if not holds:
        return "-"
    if holds["holds"] == "samples":
        return "its samples (checked deterministic)"
    return f"its files' bytes: the {holds['check']!r} check failed: {holds['why']}"


def saved_line(rec: dict[str, Any]) -> str:
    """One line on the other loaders under the recommendation; "" where none was priced."""
    others = rec.get("other_loaders")
    if not others:
        return ""
    if "saved_s_per_epoch" in others:
        return (
            f"  other loaders: the config's sample cache saves {others['saved_s_per_epoch']:g} s "
            "an epoch on their passes, from each one's second pass (priced; the training "
            "loop's price above is unchanged)"
        )
    unapplied = others.get("saved_s_per_epoch_unapplied")
    lost = f" ({unapplied:g} s an epoch)" if unapplied else ""
    return f"  other loaders: {others['why']}{lost}"


def verified_lines(v: dict[str, Any]) -> list[str]:
    """The verification's pass of each priced other loader beside its price."""
    out = []
    for r in v.get("loaders") or []:
        if r.get("measured_pass_s") is None:
            out.append(f"  loader #{r['index']} ({r['dataset']}): {r['why']}")
            continue
        err = f", error {r['error']:.0%}" if r.get("error") is not None else ""
        out.append(
            f"  loader #{r['index']} ({r['dataset']}): a pass took {r['measured_pass_s']:.3f} s "
            f"(median of {r['passes']}), priced {r['priced_pass_s']:.3f} s{err}; "
            f"{r['pass_s_before']:.3f} s before"
        )
    return out
