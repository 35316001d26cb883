"""The torchvision guide's tables (docs/guide/torchvision.md), made from the committed runs
of `unstall bench torchvision` (``docs/bench/torchvision*.json``), so no figure is typed:

- ``torchvision-runs.md``: one row per run (the load, both sides' medians, the pairs), and
  the median of the idle runs' pairs;
- ``torchvision-cpu.md``: CPU per sample by JPEG size, the script's transform against
  unstall's (each run's ``cpu_by_size``), as the range over the runs and its median.

``docs/gen_reference.py`` calls `outputs`; ``python docs/gen_tables.py`` writes them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

DOCS = Path(__file__).resolve().parent
GENERATED = DOCS / "generated"
BENCH = DOCS / "bench"
#: the committed runs, in the order the guide tells them ("" is the headline run)
RUNS = ("idle1", "idle2", "", "run1", "run2", "run3")
#: the runs made with nothing else on the machine
IDLE = ("idle1", "idle2", "")


def _results(bench: Path, runs: tuple[str, ...] = RUNS) -> dict[str, dict]:
    """Each committed run's ``result``, by its name in `RUNS`."""
    out = {}
    for variant in runs:
        path = bench / (f"torchvision-{variant}.json" if variant else "torchvision.json")
        if path.is_file():
            out[variant] = json.loads(path.read_text())["result"]
    return out


def torchvision_runs(bench: Path = BENCH) -> str:
    """One row per committed run of `unstall bench torchvision`: the load other processes put
    on the machine, both sides' medians, the pairs' ratios and the two ways to sum them up;
    then the median of the idle runs' pairs."""
    rows = [
        "| run | others' cores | as is (median) | under the config (median) | pairs' ratios "
        "| median pair | ratio of the medians |",
        "|---|---|---|---|---|---|---|",
    ]
    results = _results(bench)
    for variant, res in results.items():
        others = res.get("others_cores", {})
        load = statistics.median([*others.get("as_is", []), *others.get("applied", [])])
        name = f"`{variant}`" if variant else "`torchvision` (the headline)"
        ratio = f"{res['ratio']:.2f}x"
        rows.append(
            f"| {name} | {load:.2f} | {res['baseline']['samples_per_s']:,.0f}/s "
            f"| {res['unstall']['samples_per_s']:,.0f}/s "
            f"| {', '.join(f'{r:.2f}' for r in res['pair_ratios'])} "
            f"| {f'**{ratio}**' if not variant else ratio} | {res['ratio_of_medians']:.2f}x |"
        )
    pairs = [r for v in IDLE if v in results for r in results[v]["pair_ratios"]]
    if pairs:
        names = ", ".join(f"`{v or 'torchvision'}`" for v in IDLE)
        rows.append(
            f"\nThe idle runs' ({names}) "
            f"{len(pairs)} pairs: median {statistics.median(pairs):.2f}x."
        )
    return "\n".join(rows) + "\n"


def _span(values: list[float], fmt: str) -> str:
    """``low-high`` of ``values`` (one figure where they are equal)."""
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


def cpu_by_size(bench: Path = BENCH) -> str:
    """CPU per sample by JPEG size and kind, the script's transform ("as is") against
    unstall's lean pipeline, one thread, over every committed run: the range and, for the
    ratio, its median."""
    results = _results(bench)
    by_image: dict[tuple[str, str], list[dict]] = {}
    for res in results.values():
        for row in res.get("cpu_by_size") or []:
            by_image.setdefault((row["size"], row["kind"]), []).append(row)
    if not by_image:
        return "*No run of `unstall bench torchvision` with `cpu_by_size` is committed.*\n"
    rows = [
        f"| JPEGs | crops decoded at 1/2 or 1/4 | as is | lean | ratio (median of the "
        f"{len(results)} runs) |",
        "|---|---|---|---|---|",
    ]
    for (size, kind), sizes in by_image.items():
        kb = _span([r["kb"] for r in sizes], ",.0f")
        what = (
            "the bench's"
            if size == "500x375"
            else ("smooth" if kind == "smooth" else "the same grain")
        )
        ratios = [r["ratio"] for r in sizes]
        rows.append(
            f"| {size}, {what} ({kb} KB) | {_span([r['reduced_dct'] for r in sizes], '.0%')} "
            f"| {_span([r['script_ms'] for r in sizes], '.1f')} ms "
            f"| {_span([r['lean_ms'] for r in sizes], '.1f')} ms "
            f"| {_span(ratios, '.2f')}x ({statistics.median(ratios):.2f}x) |"
        )
    return "\n".join(rows) + "\n"


def outputs() -> dict[Path, str]:
    """The files this module writes, with their content."""
    return {
        GENERATED / "torchvision-runs.md": torchvision_runs(),
        GENERATED / "torchvision-cpu.md": cpu_by_size(),
    }
